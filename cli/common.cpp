// Model loading for the CLI: flags, memory plan, progress bar.
#include "common.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "base/cache_dir.h"
#include "base/input_file.h"
#include "text/json_schema.h"
#include "format.h"
#include "model/kv_layout.h"
#include "model/summary.h"

namespace vkllm::cli {

bool stderr_is_tty() { return isatty(STDERR_FILENO) == 1; }
bool stdout_is_tty() { return isatty(STDOUT_FILENO) == 1; }

std::string fmt_ms(double ms) {
  char buf[32];
  if (ms < 1000) std::snprintf(buf, sizeof buf, "%.0f ms", ms);
  else std::snprintf(buf, sizeof buf, "%.2f s", ms / 1000);
  return buf;
}

void add_model_options(CLI::App* cmd, RunOptions& o) {
  cmd->add_option("-m,--model", o.model, "GGUF model file")->required();
  cmd->add_option("--device", o.device, "Vulkan device index (see `vkllm devices`)");
  cmd->add_option("-c,--ctx", o.ctx, "KV cache capacity in tokens (default, or 0: min(trained context, 4096))")->check(CLI::Range(0u, k_max_ctx));
  const CLI::IsMember types = cache_type_names();
  cmd->add_option("--cache-type", o.cache_type, "KV cache type for K and V: f16, q8_0, q4_0")->check(types);
  cmd->add_option("--cache-type-k", o.cache_type_k, "KV cache type for K")->check(types);
  cmd->add_option("--cache-type-v", o.cache_type_v, "KV cache type for V")->check(types);
  cmd->add_option("--keep", o.keep, "Tokens pinned at the start of the cache, fewer than --ctx (default, or -1: BOS + system prompt)")
      ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()));
  cmd->add_option("--ubatch", o.ubatch, "Prompt tokens per prefill chunk (default: 512 on GPUs, 64 on CPU drivers)")->check(CLI::Range(1u, 8192u));
  cmd->add_flag("--swa-full", o.swa_full,
                "Sliding-window layers keep the whole context instead of their window (more memory; every prompt-cache prefix reusable)");
  cmd->add_flag("-q,--quiet", o.quiet, "No statistics on stderr");
  cmd->add_flag("--profile", o.profile, "Print GPU time per op at the end");
  add_attention_option(cmd, o.attention);
  add_rope_options(cmd, o.rope);
}

namespace {
const std::map<std::string, AttentionKernel> k_attention_kernels = {
    {"auto", AttentionKernel::Auto}, {"tiled", AttentionKernel::Tiled}, {"simd", AttentionKernel::Simd}, {"lanes", AttentionKernel::Lanes}};
}

CLI::Option* add_attention_option(CLI::App* cmd, AttentionKernel& k) {
  // The names only: a CheckedTransformer would also take the enum's numbers ("2" as simd) and
  // print its map in the error.
  std::vector<std::string> names;
  for (const auto& [name, kernel] : k_attention_kernels) names.push_back(name);
  return cmd
      ->add_option_function<std::string>(
          "--attention", [&k](const std::string& name) { k = k_attention_kernels.at(name); },
          "Attention kernel: auto, tiled (GPUs), simd or lanes (CPU drivers)")
      ->check(CLI::IsMember(names))
      ->option_text("auto|tiled|simd|lanes");
}

std::string attention_kernel_name(AttentionKernel k) {
  for (const auto& [name, kernel] : k_attention_kernels)
    if (kernel == k) return name;
  return "auto";
}

CLI::IsMember cache_type_names() {
  std::vector<std::string> names;
  for (CacheType t : k_cache_types) names.emplace_back(cache_type_name(t));
  return CLI::IsMember(names);
}

std::pair<CacheType, CacheType> cache_types(const RunOptions& o) {
  const auto type = [&](const std::string& one) {
    const std::string& name = !o.cache_type.empty() ? o.cache_type : !one.empty() ? one : "f16";
    const std::optional<CacheType> t = cache_type_from_name(name);
    if (!t) throw CLI::ValidationError("unknown cache type " + name);
    return *t;
  };
  return {type(o.cache_type_k), type(o.cache_type_v)};
}

void add_rope_options(CLI::App* cmd, RopeOverrides& r) {
  // A number in [lo, hi] as the float the option stores (CLI11's own checks read a double, so
  // 1e39 passed as inf and 1e-50 as 0, which means "the file's value").
  const auto within = [](float lo, float hi) {
    return CLI::Validator(
        [lo, hi](std::string& v) {
          char* end = nullptr;
          const float x = std::strtof(v.c_str(), &end);
          if (end == v.c_str() || *end != '\0' || !(x >= lo && x <= hi)) {
            char range[64];
            std::snprintf(range, sizeof range, "%g to %g", double(lo), double(hi));
            return v + " is not a number from " + range;
          }
          return std::string();
        },
        "");
  };
  const CLI::Validator positive = within(1e-30f, 1e30f);
  const std::string group = "RoPE (llama.cpp's flags; a saved session or prompt-cache entry is reused only with the same)";
  cmd->add_option("--rope-scaling", r.scaling, "RoPE scaling type: none, linear, yarn (default: the model's)")
      ->check(CLI::IsMember({"none", "linear", "yarn"}))
      ->group(group);
  CLI::Option* scale = cmd->add_option_function<float>("--rope-scale", [&r](float n) { r.freq_scale = 1.0f / n; },
                                                         "RoPE context scaling factor N: positions × 1/N (default: the model's)")
                           ->check(positive)
                           ->group(group);
  cmd->add_option("--rope-freq-scale", r.freq_scale, "RoPE frequency scale (1/--rope-scale)")->check(positive)->excludes(scale)->group(group);
  cmd->add_option("--rope-freq-base", r.freq_base, "RoPE base frequency (default: the model's)")->check(positive)->group(group);
  cmd->add_option("--yarn-orig-ctx", r.orig_ctx, "YaRN: the model's original context (default: the model's)")
      ->check(CLI::Range(1u, k_max_ctx))
      ->group(group);
  cmd->add_option("--yarn-ext-factor", r.ext_factor, "YaRN extrapolation mix, 0 to 1 (default: 1 with yarn, else 0)")
      ->check(within(0.0f, 1.0f))
      ->group(group);
  cmd->add_option("--yarn-attn-factor", r.attn_factor, "Scale of RoPE's cos and sin where YaRN is off (default 1; YaRN sets its own)")
      ->check(positive)
      ->group(group);
  cmd->add_option("--yarn-beta-fast", r.beta_fast, "YaRN low correction dim (default 32)")->check(positive)->group(group);
  cmd->add_option("--yarn-beta-slow", r.beta_slow, "YaRN high correction dim (default 1)")->check(positive)->group(group);
}

void add_grammar_options(CLI::App* cmd, GrammarFlags& g) {
  const std::string group = "Grammar (one of)";
  std::vector<CLI::Option*> opts = {
      cmd->add_option("--grammar", g.grammar, "Constrain the generated text to this GBNF grammar (llama.cpp's format; docs/sampling.md)"),
      cmd->add_option("--grammar-file", g.grammar_file, "Constrain the generated text to the GBNF grammar in this file"),
      cmd->add_option("-j,--json-schema", g.json_schema, "Constrain the generated text to JSON this JSON Schema accepts"),
      cmd->add_option("--json-schema-file", g.json_schema_file, "Constrain the generated text to JSON the schema in this file accepts")};
  const CLI::Validator not_empty([](std::string& v) { return v.empty() ? std::string("empty (an unset variable?): give a grammar") : std::string(); },
                                 "TEXT");
  for (CLI::Option* o : opts) {
    o->group(group)->check(not_empty);
    for (CLI::Option* other : opts)
      if (other != o) o->excludes(other);
  }
}

std::shared_ptr<const Grammar> read_grammar_flags(const GrammarFlags& g) {
  if (!g.grammar_file.empty()) return Grammar::parse(read_text_input(g.grammar_file, "the grammar file"), g.grammar_file);
  if (!g.grammar.empty()) return Grammar::parse(g.grammar, "--grammar");
  const bool from_file = !g.json_schema_file.empty();
  if (!from_file && g.json_schema.empty()) return nullptr;
  const std::string name = from_file ? g.json_schema_file : "--json-schema";
  const std::string text = from_file ? read_text_input(g.json_schema_file, "the JSON schema file") : g.json_schema;
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(name + ": not JSON: " + json_error_text(e));
  }
  try {
    return json_schema_grammar(schema);
  } catch (const Error& e) {
    throw Error(name + ": " + e.what());
  }
}

std::vector<CLI::Option*> add_speculative_options(CLI::App* cmd, SpeculativeOptions& s, std::string& model_draft) {
  const std::string group = "Speculative decoding (docs/speculative.md)";
  cmd->add_option("--model-draft", model_draft,
                  "(-md) A smaller model of the same vocabulary that drafts tokens greedily for the model to verify in one pass "
                  "(the same tokens, sooner)")
      ->check(CLI::ExistingFile)
      ->group(group);
  std::vector<CLI::Option*> tuning;  // the flags that tune one source of drafts or another
  tuning.push_back(cmd->add_option("--draft-p-min", s.p_min, "With -md: a draft ends before a token the draft model gives less than this probability (default 0.8)")
                       ->check(CLI::Range(0.0f, 1.0f))
                       ->group(group));
  cmd->add_option_function<std::string>(
         "--spec-type", [&s](const std::string& v) { s.type = v == "ngram-simple" ? SpecType::NgramSimple : SpecType::None; },
         "none, or ngram-simple: draft the tokens that followed the last earlier occurrence of the context's final n-gram "
         "and verify them in one pass (the same tokens, sooner)")
      ->check(CLI::IsMember({"none", "ngram-simple"}))
      ->group(group);
  const CLI::Range count(1u, 1024u);
  tuning.push_back(cmd->add_option("--draft-max,--draft,--draft-n", s.draft_max, "The most draft tokens a pass verifies (default 16)")->check(count)->group(group));
  tuning.push_back(cmd->add_option("--draft-min,--draft-n-min", s.draft_min, "Drafts run at least this long whatever the measured acceptance, or not at all (default 0: as measured)")->check(CLI::Range(0u, 1024u))->group(group));
  tuning.push_back(cmd->add_option("--spec-ngram-size-n", s.ngram_n, "Tokens of the n-gram looked up in the context (default 4)")->check(count)->group(group));
  tuning.push_back(cmd->add_option("--spec-ngram-size-m", s.ngram_m, "The most tokens one match drafts (default 48)")->check(count)->group(group));
  return tuning;
}

void note_idle_draft_flags(std::span<CLI::Option* const> given, const SpeculativeOptions& s, bool quiet) {
  if (quiet) return;
  std::string idle;
  for (const CLI::Option* o : given) {
    if (o->count() == 0) continue;
    const std::string& n = o->get_name();
    const bool used = n == "--draft-p-min"                                          ? s.type == SpecType::DraftModel
                      : n == "--spec-ngram-size-n" || n == "--spec-ngram-size-m" ? s.type == SpecType::NgramSimple
                                                                                   : s.type != SpecType::None;
    if (!used) idle += (idle.empty() ? "" : ", ") + n;
  }
  if (idle.empty()) return;
  const char* why = s.type == SpecType::None        ? "nothing drafts without --spec-type ngram-simple or -md"
                    : s.type == SpecType::DraftModel ? "for n-gram drafts (--spec-type ngram-simple), and -md drafts here"
                                                     : "for -md's drafts, and n-grams draft here";
  std::fprintf(stderr, "vkllm: note: %s ignored: %s\n", idle.c_str(), why);
}

namespace {
// A pass holds the sampled token and its drafts: a --draft-min past that would silently draft nothing.
// `bound`: what holds a pass to `pass` tokens, where known ("--ubatch 8").
void check_draft_min_fits(const SpeculativeOptions& s, uint32_t pass, const std::string& bound) {
  if (!s.on() || pass == 0 || s.draft_min < pass) return;
  throw CLI::ValidationError("--draft-min " + std::to_string(s.draft_min) + " is more than the " + std::to_string(pass - 1) +
                             " draft" + (pass == 2 ? "" : "s") + " one verify pass holds here (" + std::to_string(pass) + " token" +
                             (pass == 1 ? "" : "s") + (bound.empty() ? "" : ": " + bound) + "): no draft could run");
}
}  // namespace

void check_speculative_options(SpeculativeOptions& s, uint32_t ubatch, const std::string& model_draft) {
  if (!(s.p_min >= 0.0f && s.p_min <= 1.0f))  // (the option's range check lets NaN through)
    throw CLI::ValidationError("--draft-p-min " + std::to_string(s.p_min) + " is not a probability (0 to 1)");
  if (!model_draft.empty()) {
    if (s.type == SpecType::NgramSimple)
      throw CLI::ValidationError("--model-draft and --spec-type ngram-simple are two sources of drafts: give one");
    s.type = SpecType::DraftModel;
  }
  const auto check_most = [&](const char* name, uint32_t most) {
    if (s.draft_min > most)
      throw CLI::ValidationError("--draft-min " + std::to_string(s.draft_min) + " is more than " + name + " " +
                                 std::to_string(most) + ": no draft could run");
  };
  check_most("--draft-max", s.draft_max);
  if (s.type != SpecType::DraftModel) check_most("--spec-ngram-size-m", s.ngram_m);  // (n-gram drafts only)
  check_draft_min_fits(s, ubatch, "--ubatch " + std::to_string(ubatch));  // an explicit --ubatch, before the model loads
}

void check_speculation(const SpeculativeOptions& s, const Engine& engine, bool quiet) {
  if (!s.on()) return;
  // (The device's --ubatch, a window ring or the logits rows may hold a pass to fewer tokens.)
  const uint32_t pass = engine.max_chunk(true);
  const KvCache& cache = engine.cache();
  std::string bound;
  if (pass == engine.ubatch()) bound = "--ubatch " + std::to_string(pass);
  else if (pass == cache.capacity() - cache.keep())
    bound = "--ctx " + std::to_string(cache.capacity()) + (cache.keep() ? " less the " + std::to_string(cache.keep()) + " pinned" : "");
  else if (cache.window_ring()) bound = "the window layers' ring";
  check_draft_min_fits(s, pass, bound);
  if (quiet || engine.verify_exact()) return;
  std::fprintf(stderr,
               "vkllm: note: %s is off for this model on %s: its window layers' lists would take one attention "
               "kernel, then another, then the first again within a verify pass (docs/speculative.md)\n",
               s.type == SpecType::DraftModel ? "--model-draft" : "--spec-type", engine.context().info().name.c_str());
}

double catch_up_draft(const Session& s, const SpeculativeOptions& spec, bool quiet) {
  if (!s.drafter() || !drafts_with_model(spec, *s.engine)) return 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  ProgressBar bar("draft prefill", "tok", quiet);
  s.drafter()->catch_up(s.engine->cache().tokens(), [&](uint64_t done, uint64_t total) { bar.update(done, total); });
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string draft_summary(const GenerationStats& st) {
  if (st.drafted == 0) return " · no drafts";
  char pct[16];
  std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * st.draft_accepted / st.drafted);
  return " · drafts " + with_commas(st.draft_accepted) + " of " + with_commas(st.drafted) + " taken (" + pct + ")";
}

void add_logit_bias_option(CLI::App* cmd, std::vector<std::string>& biases) {
  cmd->add_option("-l,--logit-bias", biases, "Add BIAS to a token's logit before sampling: TOKEN_ID+BIAS or TOKEN_ID-BIAS (-inf bans it); repeatable")
      ->allow_extra_args(false);
}

std::vector<std::pair<int32_t, float>> read_logit_bias(const std::vector<std::string>& biases, int32_t n_vocab) {
  std::vector<std::pair<int32_t, float>> out;
  for (const std::string& b : biases) {
    const auto bad = [&](const std::string& why) -> Error { return Error("--logit-bias " + b + ": " + why); };
    const size_t sign = b.find_first_of("+-", 1);
    long long id = -1;
    if (sign == std::string::npos || !CLI::detail::lexical_cast(b.substr(0, sign), id) || id < 0)
      throw bad("expecting TOKEN_ID+BIAS or TOKEN_ID-BIAS (as 15043+1 or 2-inf)");
    double value = 0;
    const std::string magnitude = b.substr(sign + 1);
    if (magnitude == "inf") value = std::numeric_limits<double>::infinity();
    else if (!CLI::detail::lexical_cast(magnitude, value) || !std::isfinite(value) || value < 0)
      throw bad("the bias '" + magnitude + "' is not a number (or inf)");
    if (n_vocab > 0 && id >= n_vocab) throw bad("token " + std::to_string(id) + " is outside the vocabulary of " + with_commas(uint64_t(n_vocab)) + " tokens");
    out.emplace_back(int32_t(std::min<long long>(id, INT32_MAX)), float(b[sign] == '-' ? -value : value));
  }
  return out;
}

void add_stop_option(CLI::App* cmd, std::vector<std::string>& stop, const std::string& what) {
  cmd->add_option("--stop", stop, "Stop " + what + " where this string is generated (repeatable: one string each)")
      ->allow_extra_args(false);
}

void add_n_predict_option(CLI::App* cmd, int32_t& n_predict, const std::string& what) {
  const CLI::Validator count_or_endless(
      [](std::string& v) -> std::string {
        long long n = 0;
        if (CLI::detail::lexical_cast(v, n) && n >= -1 && n <= INT32_MAX) return {};
        return v + " is not a token count: give a count ≥ 0, or -1 for endless generation";
      },
      "COUNT|-1");
  cmd->add_option("-n,--n-predict", n_predict,
                  what + " (default: until end of generation or the cache is full; -1: endless, through the ring)")
      ->check(count_or_endless);
}

namespace {
// A DRY sequence breaker as llama.cpp's flag reads it: \n, \t, \\, \" and \' as their characters.
std::string unescape_breaker(const std::string& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != '\\' || i + 1 == v.size()) {
      out += v[i];
      continue;
    }
    const char c = v[++i];
    out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
  }
  return out;
}
}  // namespace

std::vector<CLI::Option*> add_sampling_options(CLI::App* cmd, SamplerParams& s) {
  std::vector<CLI::Option*> opts;
  opts.push_back(cmd->add_option("--temp", s.temp, "Temperature (0: greedy)"));
  opts.push_back(cmd->add_option("--top-k", s.top_k, "Top-k (0: off)"));
  opts.push_back(cmd->add_option("--top-p", s.top_p, "Top-p, 0 to 1 (1: off)"));
  opts.push_back(cmd->add_option("--min-p", s.min_p, "Min-p, 0 to 1 (0: off)"));
  opts.push_back(cmd->add_option("--repeat-penalty", s.repeat_penalty, "Repetition penalty (1: off)"));
  opts.push_back(cmd->add_option("--repeat-last-n", s.repeat_last_n, "Tokens the penalties look back over (-1: all)"));
  opts.push_back(cmd->add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty"));
  opts.push_back(cmd->add_option("--presence-penalty", s.presence_penalty, "Presence penalty"));
  // llama.cpp's other samplers, with its flags and defaults (docs/sampling.md).
  opts.push_back(cmd->add_option("--typical,--typical-p", s.typical_p, "Locally typical sampling's mass, 0 to 1 (1: off)"));
  opts.push_back(cmd->add_option("--top-nsigma,--top-n-sigma", s.top_n_sigma,
                                 "Keep logits within N standard deviations of the best (<= 0: off)"));
  opts.push_back(cmd->add_option("--xtc-probability", s.xtc_probability, "XTC: the chance a step excludes its top choices, 0 to 1 (0: off)"));
  opts.push_back(cmd->add_option("--xtc-threshold", s.xtc_threshold, "XTC: the probability a top choice must reach to be excluded (default 0.1; > 0.5: off)"));
  opts.push_back(cmd->add_option("--dry-multiplier", s.dry_multiplier, "DRY repetition penalty's multiplier (0: off)"));
  opts.push_back(cmd->add_option("--dry-base", s.dry_base, "DRY's base, >= 1 (default 1.75)"));
  opts.push_back(cmd->add_option("--dry-allowed-length", s.dry_allowed_length, "DRY: repeats this long go unpenalised (default 2)"));
  opts.push_back(cmd->add_option("--dry-penalty-last-n", s.dry_penalty_last_n,
                                 "Tokens DRY looks back over (default 64; 0: off)"));
  // Repeatable; the first one given replaces the defaults, "none" clears them (llama.cpp's).
  opts.push_back(cmd->add_option_function<std::vector<std::string>>(
                        "--dry-sequence-breaker",
                        [&s](const std::vector<std::string>& v) {
                          s.dry_sequence_breakers.clear();
                          for (const std::string& b : v)
                            if (b != "none") s.dry_sequence_breakers.push_back(unescape_breaker(b));
                        },
                        "A text DRY never matches a repeat across (repeatable; replaces the defaults \\n : \" *; \"none\": no breakers)")
                     ->type_name("TEXT")
                     ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll));
  opts.push_back(cmd->add_option("--mirostat", s.mirostat, "Mirostat sampling: 0 off, 1 or 2 (replaces top-k … XTC)"));
  opts.push_back(cmd->add_option("--mirostat-lr", s.mirostat_eta, "Mirostat's learning rate eta (default 0.1)"));
  opts.push_back(cmd->add_option("--mirostat-ent", s.mirostat_tau, "Mirostat's target entropy tau (default 5.0)"));
  // -1 asks for a random seed, as llama.cpp's --seed does; other negatives and values past 64 bits
  // are refused rather than wrapped.
  opts.push_back(cmd->add_option_function<std::string>(
         "-s,--seed",
         [&s](const std::string& v) {
           if (v == "-1") {
             s.seed = SamplerParams{}.seed;
             return;
           }
           size_t used = 0;
           unsigned long long x = 0;
           try {
             if (!v.empty() && v[0] != '-' && v[0] != '+') x = std::stoull(v, &used, 10);
           } catch (const std::exception&) {
             used = 0;
           }
           if (used == 0 || used != v.size()) throw CLI::ValidationError("--seed", v + " is not a seed (0 to 2^64 - 1, or -1: random)");
           s.seed = x;
         },
         "RNG seed, 0 to 2^64 - 1 (default, -1 or 4294967295 as in llama.cpp: random; run --json reports the one drawn)")
      ->type_name("UINT"));
  return opts;
}

std::string fit_terminal_row(std::string line) {
  winsize ws{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && line.size() >= ws.ws_col) {
    line.resize(ws.ws_col - 1);
    while (!line.empty() && (static_cast<unsigned char>(line.back()) & 0xC0) == 0x80) line.pop_back();  // no torn character
    if (!line.empty() && static_cast<unsigned char>(line.back()) >= 0xC0) line.pop_back();
  }
  return line;
}

ProgressBar::ProgressBar(std::string label, std::string unit, bool quiet)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      start_(std::chrono::steady_clock::now()),
      last_(start_),
      tty_(stderr_is_tty()),
      quiet_(quiet) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t done, uint64_t total, const std::string& extra) {
  if (total == 0 || (!tty_ && quiet_)) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int percent = int(100.0 * double(done) / double(total));
  const std::string counts = unit_ == "bytes" ? human_bytes(done) + " / " + human_bytes(total)
                                               : with_commas(done) + " / " + with_commas(total) + " " + unit_;
  if (!tty_) {
    // A log gets a line now and then, not a bar's redraws.
    if (elapsed < 10.0 || done >= total || now - last_ < std::chrono::seconds(10)) return;
    last_ = now;
    std::fprintf(stderr, "vkllm: %s %d%% (%s)%s\n", label_.c_str(), percent, counts.c_str(), extra.c_str());
    std::fflush(stderr);
    return;
  }
  if (elapsed < 1.0 && done < total) return;
  if (shown_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  if (!shown_ && done >= total) return;  // finished within a second: nothing to show
  last_ = now;
  shown_ = true;
  const int width = 30, filled = int(double(done) / double(total) * width);
  std::string bar(size_t(filled), '=');
  bar.resize(width, ' ');
  char head[16];
  std::snprintf(head, sizeof head, "] %3d%% ", percent);
  std::string line = label_ + " [" + bar + head + counts + extra;
  std::fprintf(stderr, "\r%s", fit_terminal_row(line).c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (shown_) std::fprintf(stderr, "\r\033[K");
  shown_ = false;
}

bool warn_pin_cut(uint32_t wanted, uint32_t pinned, const KvCache& cache) {
  if (wanted <= pinned) return false;
  const std::string limit = cache.window_ring() ? " less the sliding-window rings' " + with_commas(cache.window_ring()) + " slots" : " − 1";
  std::fprintf(stderr,
               "vkllm: warning: BOS and the system prompt take %s tokens, more than the %s this cache pins (--ctx %s%s): its last %s "
               "are evicted like any token once the ring wraps (a larger --ctx, or a shorter system prompt)\n",
               with_commas(wanted).c_str(), with_commas(pinned).c_str(), with_commas(cache.capacity()).c_str(), limit.c_str(),
               with_commas(wanted - pinned).c_str());
  return true;
}

void print_profile(const std::vector<DispatchTiming>& timings, const std::string& what) {
  std::map<std::string, std::pair<double, uint64_t>> by_op;
  double total = 0;
  for (const DispatchTiming& t : timings) {
    auto& [ms, n] = by_op[t.label];
    ms += t.ms;
    ++n;
    total += t.ms;
  }
  std::vector<std::pair<std::string, std::pair<double, uint64_t>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::fprintf(stderr, "vkllm: GPU time per op (%s)\n  %-24s %10s %8s %7s\n", what.c_str(), "op", "ms", "calls", "share");
  for (const auto& [op, v] : rows)
    std::fprintf(stderr, "  %-24s %10.3f %8llu %6.1f%%\n", op.c_str(), v.first, (unsigned long long)v.second,
                 total > 0 ? 100.0 * v.first / total : 0.0);
}

void print_warnings(const Tokenizer& tok) {
  for (const std::string& w : tok.warnings()) std::fprintf(stderr, "vkllm: warning: %s\n", w.c_str());
}

namespace {
int g_stdout_error = 0;
}  // namespace

void note_stdout_error(int error) {
  if (g_stdout_error == 0) g_stdout_error = error;
}
int noted_stdout_error() { return g_stdout_error; }

bool write_stdout(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return true;
  note_stdout_error(errno);
  return false;
}

Session open_session(const RunOptions& o, const InputCheck& check_input) {
  // Sampling flags out of range are a bad command line (status 2), found before the model loads.
  try {
    Sampler::validate(o.sampling);
  } catch (const Error& e) {
    throw CLI::ValidationError(e.what());
  }
  // K and V in one type (the attention kernels read both in it, docs/kv-cache.md): a mix, or
  // --cache-type against an explicit --cache-type-k/-v, is a bad command line.
  const auto [type_k, type_v] = cache_types(o);
  const std::string tk = cache_type_name(type_k), tv = cache_type_name(type_v);
  for (const auto& [flag, value] : {std::pair{"--cache-type-k", &o.cache_type_k}, std::pair{"--cache-type-v", &o.cache_type_v}})
    if (!o.cache_type.empty() && !value->empty() && *value != o.cache_type)
      throw CLI::ValidationError(std::string(flag) + " " + *value + " contradicts --cache-type " + o.cache_type);
  if (tk != tv)
    throw CLI::ValidationError("--cache-type-k " + tk + " and --cache-type-v " + tv +
                               " differ: K and V must have the same cache type (use --cache-type)");
  // The ring needs a slot past the pinned tokens.
  const auto check_keep = [&](uint32_t capacity) {
    if (o.keep >= 0 && uint32_t(o.keep) >= capacity)
      throw CLI::ValidationError("--keep " + std::to_string(o.keep) + " pins the whole cache of " + std::to_string(capacity) +
                                 " tokens (--ctx); at most " + std::to_string(capacity - 1) + " can be pinned");
  };
  if (o.ctx == 1) throw CLI::ValidationError("--ctx 1 is too small (at least 2 tokens)");
  if (o.ctx) check_keep(o.ctx);
  Session s{gguf::File::open(o.model), nullptr, nullptr, nullptr, nullptr, nullptr, {}, {}, nullptr, {}, {}};
  const ModelSummary summary = summarize_model(s.file, o.rope);
  const ModelConfig& c = summary.config;

  EngineOptions eo;
  eo.cache.capacity = o.ctx ? o.ctx : std::min<uint32_t>(c.n_ctx_train ? c.n_ctx_train : 4096, 4096);
  check_keep(eo.cache.capacity);
  eo.cache.type_k = type_k;
  eo.cache.type_v = type_v;
  eo.n_ubatch = o.ubatch;
  eo.cache.swa_full = o.swa_full;
  eo.profile = o.profile;
  eo.attention = o.attention;

  s.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(s.file));
  if (check_input) check_input(s.file, *s.tokenizer, eo.cache.capacity);
  // A quantized row needs whole blocks: refused before the memory plan prints figures for it (after
  // the input check, which refuses a session of another model before its cache type is blamed).
  if (!cache_type_fits(type_k, c.n_embd_kv()))
    throw Error(std::string(o.cache_type.empty() ? "--cache-type-k " : "--cache-type ") + tk + " " + cache_type_misfit(c.n_embd_kv()));
  // llama.cpp refuses a quantized cache where a head is narrower than a block; vkllm runs it (the
  // blocks span heads) but says what it costs.
  if (!o.quiet && type_k == CacheType::Q4_0 && c.head_dim < 32)
    std::fprintf(stderr, "vkllm: warning: a q4_0 KV cache with head dim %u: each 32-value block spans more than one head and takes "
                 "its scale from the largest, which costs quality (stories260K, head dim 8: perplexity 12.1, against 4.1 with f16 "
                 "or q8_0)\n", c.head_dim);
  // The draft model (-md): its vocabulary must be the model's, its cache fit the same type; refused
  // before anything loads.
  std::optional<ModelSummary> draft;
  int32_t draft_unk = -1;
  if (!o.model_draft.empty()) {
    s.draft_file.emplace(gguf::File::open(o.model_draft));
    draft = summarize_model(*s.draft_file, o.rope);  // the --rope-* flags apply to it too, as llama.cpp's
    const Tokenizer draft_tokenizer = Tokenizer::from_gguf(*s.draft_file);
    const std::string why = draft_vocab_mismatch(*s.tokenizer, draft_tokenizer);
    if (!why.empty()) throw Error(o.model_draft + ": cannot draft for " + o.model + ": " + why);
    draft_unk = draft_tokenizer.unk();
    if (!cache_type_fits(type_k, draft->config.n_embd_kv()))
      throw Error(o.model_draft + ": the draft model's KV cache cannot be " + tk + ": " + cache_type_misfit(draft->config.n_embd_kv()));
  }
  print_warnings(*s.tokenizer);
  ContextOptions co;
  co.device_index = o.device;
  s.ctx = std::make_unique<VulkanContext>(co);
  // A forced kernel that cannot take this model is refused before the weights load (a late
  // internal error failed every step, and every request of the server).
  if (const std::string misfit = attention_kernel_misfit(*s.ctx, o.attention, c.head_dim, c.n_rot); !misfit.empty())
    throw Error("--attention " + attention_kernel_name(o.attention) + ": " + misfit + " (use --attention auto)");
  if (draft)
    if (const std::string misfit = attention_kernel_misfit(*s.ctx, o.attention, draft->config.head_dim, draft->config.n_rot); !misfit.empty())
      throw Error("--attention " + attention_kernel_name(o.attention) + ": the draft model: " + misfit + " (use --attention auto)");

  // An explicit --keep past what window rings allow is refused for every command, before the weights
  // load (perplexity --stream, the chat and the server shortened it without a word; docs/models.md).
  if (o.keep >= 0) {
    KvCacheOptions rings = eo.cache;
    rings.n_ubatch = eo.n_ubatch ? eo.n_ubatch : default_ubatch(*s.ctx);
    const std::string refusal = keep_refusal(uint32_t(o.keep), eo.cache.capacity, window_ring_for(c, rings));
    if (!refusal.empty()) throw CLI::ValidationError(refusal);
  }
  // Memory plan: refuse before allocating anything when it cannot fit the device-local heap.
  // Every sequence has its own cache and activations; the weights are shared. A draft model adds
  // its weights, its cache (the same capacity and type) and its activations.
  const auto plan_for = [&](const EngineOptions& e) {
    MemoryPlan p = plan_memory(*s.ctx, c, summary.weight_bytes, e);
    p.kv_cache *= o.sequences;
    p.activations *= o.sequences;
    if (draft) {
      const MemoryPlan d = plan_memory(*s.ctx, draft->config, draft->weight_bytes, e);
      p.weights += d.weights;
      p.kv_cache += d.kv_cache * o.sequences;
      p.activations += d.activations * o.sequences;
      p.largest_binding = std::max(p.largest_binding, d.largest_binding);
    }
    return p;
  };
  const MemoryPlan plan = plan_for(eo);
  uint64_t heap = 0;
  for (const auto& [bytes, local] : s.ctx->info().heaps)
    if (local) heap = std::max(heap, bytes);
  const uint64_t per_token = kv_bytes_per_token(c, eo.cache.type_k, eo.cache.type_v);
  if (!o.quiet) {
    std::fprintf(stderr, "vkllm: %s: %s params, %s (%.1f bpw, %s) · ctx %s · KV %s/%s %s/token\n", o.model.c_str(),
                 human_count(summary.n_params).c_str(), c.arch_name.c_str(), summary.bits_per_weight(),
                 human_bytes(summary.weight_bytes).c_str(), with_commas(eo.cache.capacity).c_str(), tk.c_str(), tv.c_str(),
                 human_bytes(per_token).c_str());
    std::fprintf(stderr, "vkllm: memory: weights %s + KV cache %s + activations %s = %s of %s on %s\n",
                 human_bytes(plan.weights).c_str(), human_bytes(plan.kv_cache).c_str(), human_bytes(plan.activations).c_str(),
                 human_bytes(plan.total()).c_str(), human_bytes(heap).c_str(), s.ctx->info().name.c_str());
    if (draft)
      std::fprintf(stderr, "vkllm: draft model %s: %s params, %s (%.1f bpw, %s) · KV %s/token\n", o.model_draft.c_str(),
                   human_count(draft->n_params).c_str(), draft->config.arch_name.c_str(), draft->bits_per_weight(),
                   human_bytes(draft->weight_bytes).c_str(), human_bytes(kv_bytes_per_token(draft->config, type_k, type_v)).c_str());
    // As llama.cpp warns: positions past the trained context are where a model's output degrades
    // (past the context YaRN scales it to, where --rope-* flags or the file ask for YaRN).
    const uint32_t trained = c.n_ctx_rope();
    if (trained && eo.cache.capacity > trained)
      std::fprintf(stderr, "vkllm: warning: --ctx %s is more than the %s tokens the model was trained on%s: its output may degrade past them\n",
                   with_commas(eo.cache.capacity).c_str(), with_commas(trained).c_str(), trained == c.n_ctx_train ? "" : " (with its RoPE scaling)");
  }
  if (heap && plan.total() > heap) {
    // The largest --ctx (a multiple of 256) whose whole plan fits the heap and whose largest buffer
    // fits one binding, and a cache type only where it would make this --ctx fit.
    const auto fits = [&](uint32_t ctx, CacheType t) {
      EngineOptions e = eo;
      e.cache.capacity = ctx;
      e.cache.type_k = e.cache.type_v = t;
      const MemoryPlan p = plan_for(e);
      return p.total() <= heap && p.largest_binding <= s.ctx->max_storage_range();
    };
    std::string hint;
    // In units of 256 tokens: lo fits (or is 0); hi, at or past the asked --ctx, does not.
    uint32_t lo = 0, hi = uint32_t((uint64_t{eo.cache.capacity} + 255) / 256);
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      (fits(mid * 256, eo.cache.type_k) ? lo : hi) = mid;
    }
    if (lo > 0) hint = "; try --ctx " + std::to_string(lo * 256);
    for (const CacheType t : {CacheType::Q8_0, CacheType::Q4_0}) {
      if (eo.cache.type_k == CacheType::F16 && cache_type_fits(t, c.n_embd_kv()) && fits(eo.cache.capacity, t)) {
        hint += (hint.empty() ? "; try" : " or") + std::string(" --cache-type ") + cache_type_name(t);
        break;
      }
    }
    if (hint.empty() && plan.weights <= heap) hint = "; even --ctx 256 does not fit";
    if (hint.empty()) hint = "; the weights alone do not fit: use a smaller or more quantized model";
    throw Error("not enough device memory: weights " + human_bytes(plan.weights) + " + KV cache " + human_bytes(plan.kv_cache) +
                " + activations " + human_bytes(plan.activations) + " = " + human_bytes(plan.total()) +
                (draft ? " (the draft model's included)" : "") + ", but " +
                s.ctx->info().name + " has " + human_bytes(heap) + hint);
  }

  const std::string cache_dir = user_cache_dir();
  s.pipelines = std::make_unique<Pipelines>(*s.ctx, cache_dir.empty() ? "" : cache_dir + "/pipelines.bin");
  // A CPU driver compiles each kernel when it first runs it, so the first prompt on a machine waits
  // for a minute or two, and any process's first steps a little: a status line on a terminal says why.
  if (stderr_is_tty())
    s.pipelines->set_first_use_wait([device = s.ctx->info().name, shown = -1L](double seconds) mutable {
      if (seconds < 0) {
        std::fprintf(stderr, "\r\033[K");
        shown = -1;
      } else if (long(seconds) != shown) {
        shown = long(seconds);
        // One row: a line wider than the terminal wraps, and each redraw then left a row behind.
        // Every process waits a little (lavapipe builds each kernel's code at its first dispatch,
        // from Mesa's cache after a machine's first run); the first run on a machine, minutes.
        std::string line = "vkllm: preparing the GPU kernels on " + device + " (a machine's first run compiles them: minutes): " +
                           std::to_string(shown) + " s";
        std::fprintf(stderr, "\r%s\033[K", fit_terminal_row(line).c_str());
      }
      std::fflush(stderr);
    });
  {
    ProgressBar bar("loading", "bytes", o.quiet);
    s.model = std::make_unique<Model>(*s.ctx, s.file, [&](uint64_t done, uint64_t total) { bar.update(done, total); },
                                      s.pipelines.get(), o.kernels, o.rope);
  }
  s.engine = std::make_unique<Engine>(*s.ctx, *s.pipelines, *s.model, eo);
  for (uint32_t i = 1; i < o.sequences; ++i) s.more_engines.push_back(std::make_unique<Engine>(*s.ctx, *s.pipelines, *s.model, eo));
  if (draft) {
    {
      ProgressBar bar("loading the draft model", "bytes", o.quiet);
      s.draft_model = std::make_unique<Model>(*s.ctx, *s.draft_file, [&](uint64_t done, uint64_t total) { bar.update(done, total); },
                                              s.pipelines.get(), o.kernels, o.rope);
    }
    // Before anything is measured a draft pass costs what its weights' bytes are of the model's: a
    // step reads them once (on a GPU the measure of a step; a CPU driver's matvec is bound more by
    // its arithmetic, about the same per byte).
    const double ratio = double(draft->weight_bytes) / double(std::max<uint64_t>(summary.weight_bytes, 1));
    for (uint32_t i = 0; i < o.sequences; ++i) {
      try {
        s.draft_engines.push_back(std::make_unique<Engine>(*s.ctx, *s.pipelines, *s.draft_model, eo));
      } catch (const Error& e) {  // (its cache's rows past one binding: the message names --ctx, not the model)
        throw Error("the draft model " + o.model_draft + ": " + e.what());
      }
      s.drafters.push_back(std::make_unique<DraftModel>(*s.draft_engines.back(), s.tokenizer->n_vocab(), draft_unk, ratio));
    }
  }
  return s;
}

}  // namespace vkllm::cli
