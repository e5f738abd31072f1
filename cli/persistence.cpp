// --session / --prompt-cache flags and messages.
#include "persistence.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "atomic_file.h"
#include "base/ascii.h"
#include "base/input_file.h"
#include "format.h"

namespace vkllm::cli {

void add_session_option(CLI::App* cmd, std::string& session) {
  cmd->add_option("--session", session,
                  "Session file: loaded when it exists, saved after the call (run) or every turn (chat); docs/session-format.md")
      ->check([](const std::string& v) { return v.empty() ? std::string("an empty file name (no session would be kept)") : std::string(); });
}

void check_session_path(const std::string& session) {
  if (session.empty()) return;
  require_regular_file(session, "a session file");
  // The session is saved after the call: a path that cannot be written is refused before the
  // model loads, not after the text was generated.
  try {
    gguf::check_writable(session);
  } catch (const gguf::Error& e) {
    throw Error(e.what());
  }
}

ModelFingerprint precheck_session(const std::string& session, const gguf::File& model, uint32_t n_ctx, const RunOptions& o) {
  ModelFingerprint fp = model_fingerprint(model, n_ctx, o.rope);
  const SessionInfo info = read_session_info(session, false);
  check_session_model(session, info, fp);
  const auto [type_k, type_v] = cache_types(o);
  check_session_cache_types(session, info, type_k, type_v);
  return fp;
}

RunOptions with_session_cache_type(const std::string& session, RunOptions o) {
  if (!o.cache_type.empty() || !o.cache_type_k.empty() || !o.cache_type_v.empty()) return o;
  try {
    const SessionInfo info = read_session_info(session, false);
    if (info.type_k == info.type_v) o.cache_type = cache_type_name(info.type_k);
  } catch (const Error&) {
    // A file that cannot be read is refused by precheck_session, after the command line's own checks.
  }
  return o;
}

bool session_to_resume(const std::string& session, bool quiet) {
  std::error_code ec;
  if (session.empty() || !std::filesystem::exists(session, ec)) return false;
  if (std::filesystem::is_regular_file(session, ec) && std::filesystem::file_size(session, ec) == 0 && !ec) {
    if (!quiet) std::fprintf(stderr, "vkllm: session %s is empty: starting a new session\n", session.c_str());
    return false;
  }
  return true;
}

void add_persistence_options(CLI::App* cmd, PersistenceOptions& o) {
  add_session_option(cmd, o.session);
  add_prompt_cache_options(cmd, o);
}

void add_prompt_cache_options(CLI::App* cmd, PersistenceOptions& o) {
  o.prompt_cache_opt = cmd->add_option("--prompt-cache", o.prompt_cache_dir,
                  "Reuse and store prompt prefixes' KV state in DIR (default $XDG_CACHE_HOME/vkllm/prompt-cache)")
      ->expected(0, 1);
  cmd->add_option("--prompt-cache-size", o.prompt_cache_size, "Size cap of the prompt cache, least recently used evicted first (default 2GiB)");
}

std::string prompt_cache_dir(const PersistenceOptions& o, const std::string& option) {
  // (CLI11 gives `--prompt-cache ""` as it gives a bare `--prompt-cache`: both are the default.)
  if (!o.prompt_cache_dir.empty()) return o.prompt_cache_dir;
  std::string d = default_prompt_cache_dir();
  if (d.empty()) throw Error(option + ": no cache directory (XDG_CACHE_HOME unset or relative, HOME unset); give one with " + option + " DIR");
  return d;
}

void check_prompt_cache_dir(const std::string& dir) {
  // llama.cpp's --prompt-cache names a state file: such a file is refused, not run past with "no
  // entry" and "cannot create … Not a directory".
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
    const bool file = std::filesystem::is_regular_file(dir, ec);
    throw Error("--prompt-cache " + dir + (file ? " is a file" : " is not a directory (a device, pipe or socket)") +
                "; it names a directory of prompt prefixes (one conversation in one file is run's --session)");
  }
}

uint64_t parse_size(const std::string& flag, const std::string& text) {
  // Decimal digits with an optional fraction (2, 1.5, .5), then an optional unit: not stod's hex,
  // exponents or spaces. At least one byte.
  size_t used = 0, digits = 0;
  const auto digits_at = [&] {
    for (; used < text.size() && std::isdigit(static_cast<unsigned char>(text[used])); ++used) ++digits;
  };
  digits_at();
  if (used < text.size() && text[used] == '.') {
    ++used;
    digits_at();
  }
  const std::string unit = ascii_lower(text.substr(used));
  double mul = 0;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb") mul = 0x1p10;
  else if (unit == "m" || unit == "mib" || unit == "mb") mul = 0x1p20;
  else if (unit == "g" || unit == "gib" || unit == "gb") mul = 0x1p30;
  else if (unit == "t" || unit == "tib" || unit == "tb") mul = 0x1p40;
  const double v = digits > 0 ? std::strtod(text.substr(0, used).c_str(), nullptr) * mul : 0;
  // A bad command line (status 2).
  if (digits == 0 || mul == 0 || !(v >= 1) || !(v < 0x1p63))
    throw CLI::ValidationError(flag + " '" + text + "' is not a size of at least one byte (e.g. 2GiB, 512M, 1000000)");
  return static_cast<uint64_t>(v);
}

std::string divergence_message(const Tokenizer& tok, std::span<const int32_t> prompt, const PromptCacheMatch& m) {
  const size_t d = m.matched;
  // About 24 characters either side of the first differing token, newlines made visible: enough
  // to recognise a timestamp or a changed name.
  const size_t from = d >= 24 ? d - 24 : 0, to = std::min(prompt.size(), d + 24);
  // One detokenization cut at the differing token, so that its SPM space stays (a span of its own
  // would drop the space of its first token).
  std::string before = tok.detokenize(prompt.subspan(from, d - from), false);
  const std::string both = tok.detokenize(prompt.subspan(from, to - from), false);
  std::string after = both.starts_with(before) ? both.substr(before.size()) : tok.detokenize(prompt.subspan(d, to - d), false);
  const bool cut_before = before.size() > 24 || from > 0, cut_after = after.size() > 24 || to < prompt.size();
  // Trim on UTF-8 character boundaries.
  if (before.size() > 24) {
    size_t at = before.size() - 24;
    while (at < before.size() && (static_cast<unsigned char>(before[at]) & 0xC0) == 0x80) ++at;
    before.erase(0, at);
  }
  if (after.size() > 24) {
    size_t at = 24;
    while (at > 0 && (static_cast<unsigned char>(after[at]) & 0xC0) == 0x80) --at;
    after.resize(at);
  }
  std::string shown;
  for (char ch : before + after) {
    if (ch == '\n') shown += "\\n";
    else if (ch == '\t') shown += "\\t";
    else shown += ch;
  }
  return "matched " + with_commas(d) + " of " + with_commas(prompt.size()) + " tokens: the prompt differs from the cached one at token " +
         with_commas(d) + ", '" + (cut_before ? "…" : "") + shown + (cut_after ? "…" : "") + "'";
}

std::string apply_sampling_flags(const std::string& session, Sampler& restored, const SamplerParams& flags,
                                 std::span<CLI::Option* const> given) {
  SamplerParams p = restored.params();
  std::string names;
  bool reseed = false;
  // A flag given with the value the file holds changes nothing: a script that passes the same
  // flags on every call continues exactly (the same --seed does not restart the RNG).
  const auto take = [&](const CLI::Option* o, auto& saved, const auto& value) {
    if (saved == value) return;
    saved = value;
    names += (names.empty() ? "" : ", ") + o->get_name();
  };
  for (const CLI::Option* o : given) {
    if (o->count() == 0) continue;
    const std::string& n = o->get_name();
    if (n == "--temp") take(o, p.temp, flags.temp);
    else if (n == "--top-k") take(o, p.top_k, flags.top_k);
    else if (n == "--top-p") take(o, p.top_p, flags.top_p);
    else if (n == "--min-p") take(o, p.min_p, flags.min_p);
    else if (n == "--repeat-penalty") take(o, p.repeat_penalty, flags.repeat_penalty);
    else if (n == "--repeat-last-n") take(o, p.repeat_last_n, flags.repeat_last_n);
    else if (n == "--frequency-penalty") take(o, p.frequency_penalty, flags.frequency_penalty);
    else if (n == "--presence-penalty") take(o, p.presence_penalty, flags.presence_penalty);
    else if (n == "--typical") take(o, p.typical_p, flags.typical_p);
    else if (n == "--top-nsigma") take(o, p.top_n_sigma, flags.top_n_sigma);
    else if (n == "--xtc-probability") take(o, p.xtc_probability, flags.xtc_probability);
    else if (n == "--xtc-threshold") take(o, p.xtc_threshold, flags.xtc_threshold);
    else if (n == "--dry-multiplier") take(o, p.dry_multiplier, flags.dry_multiplier);
    else if (n == "--dry-base") take(o, p.dry_base, flags.dry_base);
    else if (n == "--dry-allowed-length") take(o, p.dry_allowed_length, flags.dry_allowed_length);
    else if (n == "--dry-penalty-last-n") take(o, p.dry_penalty_last_n, flags.dry_penalty_last_n);
    else if (n == "--dry-sequence-breaker") take(o, p.dry_sequence_breakers, flags.dry_sequence_breakers);
    else if (n == "--mirostat") take(o, p.mirostat, flags.mirostat);
    else if (n == "--mirostat-lr") take(o, p.mirostat_eta, flags.mirostat_eta);
    else if (n == "--mirostat-ent") take(o, p.mirostat_tau, flags.mirostat_tau);
    else if (n == "--seed" && (flags.seed == Sampler::kRandomSeed || flags.seed != restored.seed())) {
      p.seed = flags.seed;  // -1: a new random one
      reseed = true;
      names += (names.empty() ? "" : ", ") + n;
    }
  }
  if (names.empty()) return "";
  restored.set_params(p, reseed);
  return "session " + session + ": " + names + " as given; the other sampling settings" + (reseed ? "" : " and the RNG") +
         " go on from the file";
}

void print_cache_warnings(PromptCache& pc) {
  for (const std::string& w : pc.take_warnings()) std::fprintf(stderr, "vkllm: warning: %s\n", w.c_str());
}

std::string unfinished_save_note(const SessionInfo& info) {
  if (info.unfinished_bytes == 0) return "";
  return "; its last save did not finish: " + with_commas(info.unfinished_bytes) + " bytes after offset " +
         std::to_string(info.file_bytes - info.unfinished_bytes) + " ignored (the next save cuts them off)";
}

std::string appended_note(const SessionJournal& journal) {
  if (journal.replaced_changed)
    return " (the file had changed on disk since this run loaded or saved it, as another run's save changes it: that save is replaced)";
  return journal.appended ? " (" + human_bytes(journal.appended) + " appended)" : "";
}

}  // namespace vkllm::cli
