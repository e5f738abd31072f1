// `vkllm run`: one prompt in, the generated text out on stdout, one stats line on stderr.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "base/input_file.h"
#include "chat/conversation.h"
#include "chat/template.h"
#include "commands.h"
#include "common.h"
#include "format.h"
#include "engine/generate.h"
#include "persistence.h"
#include "chat/prompt.h"
#include "store/session_file.h"

namespace vkllm::cli {
namespace {

struct RunCommand {
  RunOptions opts;
  std::string prompt, prompt_file, system, chat_template;
  bool chat = false, json = false, ignore_eos = false, logprobs = false, special = false;
  uint32_t top_logprobs = 0;
  int32_t n_predict = GenerateOptions::kUntilFull;
  std::vector<std::string> stop;
  GrammarFlags grammar;
  std::vector<std::string> logit_bias;
  SpeculativeOptions speculative;
  PersistenceOptions persist;
  std::vector<CLI::Option*> sampling_flags;  // which a resumed session takes (apply_sampling_flags)
  std::vector<CLI::Option*> draft_flags;     // add_speculative_options' (note_idle_draft_flags)
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A raw-text session continued without --chat: refused when the file holds a chat (a chat session
// continues through its Conversation, which refuses raw-text files).
void check_raw_session(const std::string& path, const std::string& blob) {
  if (blob.empty()) return;
  const nlohmann::json conv = nlohmann::json::parse(blob, nullptr, false);
  if (conv.is_discarded() || !conv.is_object()) throw Error(path + ": section 'CONV' is not a JSON object");
  if (conv.contains("messages") && conv["messages"].is_array()) throw Error(path + ": holds a chat session; continue it with --chat");
}

// stdin (when it is not a terminal) first, then -f FILE, then -p TEXT: the static part of a
// prompt (a manual piped in) comes before the question, so the cache can reuse it.
std::string gather_prompt(const RunCommand& c) {
  std::string text;
  // (A closed stdin, `<&-`, is no input.)
  if (!isatty(STDIN_FILENO) && ::fcntl(STDIN_FILENO, F_GETFD) != -1) {
    // A pipe that stays open (a script's own stdin, inherited: `while read q; do vkllm run -p "$q"`)
    // is waited for without a word otherwise; after 2 s of nothing a note says what it waits on.
    if (pollfd in{STDIN_FILENO, POLLIN, 0}; !c.opts.quiet && ::poll(&in, 1, 2000) == 0)
      std::fprintf(stderr, "vkllm: waiting for the prompt on stdin, which is piped and still open (</dev/null when the prompt is -p or -f alone)\n");
    text += read_fd_input(STDIN_FILENO, "stdin", "the prompt");
  }
  if (!c.prompt_file.empty()) text += read_text_input(c.prompt_file, "the prompt file");
  text += c.prompt;
  return text;
}

void print_stats(const GenerationStats& st, const KvCache& kv, bool speculative) {
  // (The ring's evictions, when it wrapped: what the cache no longer holds of the conversation.)
  const std::string evicted = kv.evicted() ? " (" + with_commas(kv.evicted()) + " evicted)" : "";
  std::fprintf(stderr, "vkllm: prompt %s tok (cached %s) · TTFT %s · prefill %.1f tok/s · decode %.1f tok/s · %s tok generated (%s)%s · KV %s used%s, %s, %s/token\n",
               with_commas(st.prompt_tokens).c_str(), with_commas(st.cached_tokens).c_str(), fmt_ms(st.ttft_ms).c_str(),
               st.prefill_tok_s(), st.decode_tok_s(), with_commas(st.generated).c_str(), st.stop_reason.c_str(),
               speculative ? draft_summary(st).c_str() : "", human_bytes(kv.bytes_used()).c_str(), evicted.c_str(),
               cache_type_name(kv.type_k()), human_bytes(kv.bytes_per_token()).c_str());
}

// Ctrl+C while tokens are generated stops the generation: the session is saved and the stats
// printed as after any stop, and the status is 130 (`-n -1 --session` has no other way to end
// and keep what it made). SIGTERM (`timeout`, a service manager) and SIGHUP (a closed terminal)
// stop it the same way, status 143 and 129. The handlers are installed for the generation only:
// a second signal of the same kind (SA_RESETHAND), or one during the prefill, ends the process at
// once.
std::atomic<int> g_stop_signal{0};
bool stopped_by_signal() { return g_stop_signal.load() != 0; }
extern "C" void on_run_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
}

// A signal the process was started ignoring (SIGINT in a script's background job, SIGHUP under
// nohup) stays ignored.
class SignalsStopGeneration {
 public:
  SignalsStopGeneration() {
    for (size_t i = 0; i < kSignals.size(); ++i) {
      sigaction(kSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler == SIG_IGN) continue;
      struct sigaction sa {};
      sa.sa_handler = on_run_stop_signal;
      sa.sa_flags = SA_RESETHAND | SA_RESTART;  // restarted: a write to a full pipe is not cut short
      sigemptyset(&sa.sa_mask);
      sigaction(kSignals[i], &sa, nullptr);
      installed_[i] = true;
    }
  }
  ~SignalsStopGeneration() {
    for (size_t i = 0; i < kSignals.size(); ++i)
      if (installed_[i] && g_stop_signal.load() != kSignals[i]) sigaction(kSignals[i], &old_[i], nullptr);
  }

 private:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
  std::array<bool, 3> installed_{};
};

// A prompt the cache cannot hold with room to generate: without -n nothing would come out (the run
// stops when the cache is first full), so that is refused, as llama.cpp refuses a prompt longer
// than its context; with -n the ring runs through it, dropping its oldest tokens (a warning).
void check_prompt_fits(size_t n_prompt, uint32_t capacity, int32_t n_predict) {
  if (n_prompt < capacity) return;
  if (n_predict == GenerateOptions::kUntilFull)
    throw Error("the prompt is " + with_commas(n_prompt) + " tokens and --ctx " + with_commas(capacity) +
                " holds no more: nothing would be generated (a larger --ctx, or -n N to run through the ring, dropping the "
                "prompt's oldest tokens)");
  if (n_prompt > capacity)
    std::fprintf(stderr, "vkllm: warning: the prompt is %s tokens, more than --ctx %s: the ring keeps the pinned ones and the newest\n",
                 with_commas(n_prompt).c_str(), with_commas(capacity).c_str());
}

// Returns the exit status: 0, or 128 + the signal after Ctrl+C, SIGTERM or SIGHUP stopped the generation.
int run(const RunCommand& c) {
  const std::string text = gather_prompt(c);
  // Flags are checked before the model loads.
  const std::shared_ptr<const Grammar> grammar = read_grammar_flags(c.grammar);
  std::vector<std::pair<int32_t, float>> logit_bias = read_logit_bias(c.logit_bias, 0);
  SpeculativeOptions speculative = c.speculative;
  check_speculative_options(speculative, c.opts.ubatch, c.opts.model_draft);
  note_idle_draft_flags(c.draft_flags, speculative, c.opts.quiet);
  const uint64_t prompt_cache_bytes = c.persist.prompt_cache() ? parse_size("--prompt-cache-size", c.persist.prompt_cache_size) : 0;
  const std::string pc_dir = c.persist.prompt_cache() ? prompt_cache_dir(c.persist) : "";
  if (!pc_dir.empty()) check_prompt_cache_dir(pc_dir);
  check_session_path(c.persist.session);
  // A new run's prompt is tokenized, and refused where the cache cannot hold it, before the
  // weights load; a saved session's is built once the session is read.
  const bool resuming = session_to_resume(c.persist.session, c.opts.quiet);
  PromptTokens p;
  std::optional<ModelFingerprint> checked_fp;  // computed by the session's model check
  const RunOptions opts = resuming ? with_session_cache_type(c.persist.session, c.opts) : c.opts;
  Session s = open_session(opts, [&](const gguf::File& file, const Tokenizer& tok, uint32_t capacity) {
    logit_bias = read_logit_bias(c.logit_bias, tok.n_vocab());
    if (resuming) {
      checked_fp = precheck_session(c.persist.session, file, capacity, opts);
      return;
    }
    p = c.chat ? chat_prompt(file, tok, c.chat_template, c.system, text) : raw_prompt(tok, text, c.special);
    if (!c.opts.quiet && starts_with_two_bos(tok, p.tokens)) std::fprintf(stderr, "vkllm: warning: %s\n", two_bos_warning(tok).c_str());
    check_prompt_fits(p.tokens.size(), capacity, c.n_predict);
  });
  const Tokenizer& tok = *s.tokenizer;
  speculative.draft_model = s.drafter();
  check_speculation(speculative, *s.engine, c.opts.quiet);
  KvCache& cache = s.engine->cache();
  const bool persist = !c.persist.session.empty() || c.persist.prompt_cache();
  const ModelFingerprint fp = checked_fp ? *checked_fp : persist ? model_fingerprint(s.file, cache.capacity(), c.opts.rope) : ModelFingerprint{};

  Sampler sampler(c.opts.sampling);
  Generator gen(*s.engine, tok, sampler);
  // A chat session continues as `vkllm chat` continues it (a Conversation: its account of what the
  // cache holds, so only the new turn is prefilled, also after the ring has evicted), and is
  // saved with that account.
  std::optional<Conversation> conv;
  if (c.chat && resuming)
    conv.emplace(*s.engine, tok, sampler, ChatTemplate::resolve(&s.file, c.chat_template), c.system, c.opts.keep);
  // --session: a saved conversation replaces the empty cache, sampler state included; the save
  // appends to the file what this run adds (the journal, from the load to the save).
  SessionJournal journal;
  bool resumed = false;
  double restore_ms = 0;
  nlohmann::json messages = nlohmann::json::array();  // a first chat turn's, saved with its reply
  if (resuming) {
    const auto t0 = std::chrono::steady_clock::now();
    // (A pin that fills this --ctx is refused by the load; a window-ring model's smaller limit
    // shortens it, docs/models.md, said here.)
    bool chat_state = true;  // a chat session's account of its cache (run --chat's first turn writes none)
    SessionInfo info;
    if (conv) {
      const Conversation::Restored r = conv->load(c.persist.session, fp);
      info = r.info;
      chat_state = r.chat_state;
    } else {
      info = load_session(c.persist.session, *s.engine, fp, &sampler, -1, {}, &journal);
    }
    // A chat whose file's ring had evicted without an account starts its cache again (the
    // conversation runs anew, pinned by --keep): the notes on the saved pin do not apply.
    const bool kept_cache = !conv || !conv->cached_sequence().empty();
    if (!c.opts.quiet && kept_cache && info.n_keep > cache.keep())
      std::fprintf(stderr, "vkllm: session %s: its pin of %u tokens is %u here (this --ctx's sliding-window rings pin at most %u)\n",
                   c.persist.session.c_str(), info.n_keep, cache.keep(), cache.max_keep());
    if (!conv) check_raw_session(c.persist.session, info.conversation);
    restore_ms = ms_since(t0);
    resumed = true;
    if (!c.opts.quiet)
      std::fprintf(stderr, "vkllm: session %s: %s tokens restored in %.2f ms%s%s\n", c.persist.session.c_str(),
                   with_commas(info.tokens.size()).c_str(), restore_ms,
                   chat_state ? ""
                   : kept_cache ? "; no chat state in the file (its first turn): rebuilt from the messages"
                                : "; no chat state in the file and its ring had evicted: the conversation runs again",
                   unfinished_save_note(info).c_str());
    // The saved sampler (parameters and RNG) continues the session, but for the sampling flags given.
    if (const std::string note = apply_sampling_flags(c.persist.session, sampler, c.opts.sampling, c.sampling_flags);
        !c.opts.quiet && !note.empty())
      std::fprintf(stderr, "vkllm: %s\n", note.c_str());
    // The pin is the session's too (its ring was built around it).
    if (!c.opts.quiet && kept_cache && c.opts.keep >= 0 && uint32_t(c.opts.keep) != s.engine->cache().keep())
      std::fprintf(stderr, "vkllm: session %s: the saved pin of %u tokens stays, not --keep %d\n", c.persist.session.c_str(),
                   s.engine->cache().keep(), c.opts.keep);
  }

  std::vector<int32_t> appended;  // raw text continuing a restored session
  if (c.chat) {
    if (!resumed) {
      if (!c.system.empty()) messages.push_back({{"role", "system"}, {"content", c.system}});
      messages.push_back({{"role", "user"}, {"content", text}});
    }
  } else if (resumed) {
    appended = tok.tokenize(text, false, c.special);
  }
  if (!resumed) {
    cache.set_keep(c.opts.keep >= 0 ? std::min<uint32_t>(uint32_t(c.opts.keep), cache.capacity() - 1)
                                    : std::min<uint32_t>(p.pinned, cache.max_keep()));
    if (c.opts.keep < 0) warn_pin_cut(p.pinned, cache.keep(), cache);
  }

  // A continued session holds its tokens (a chat's, its conversation); the prompt cache is for
  // new prompts' prefixes.
  if (resumed && c.persist.prompt_cache() && !c.opts.quiet)
    std::fprintf(stderr, "vkllm: --prompt-cache: not used to continue a %ssession (the session holds %s)\n", conv ? "chat " : "",
                 conv ? "the conversation" : "its tokens");
  // --prompt-cache: load the stored entry sharing the longest prefix; prefill only the rest.
  std::optional<PromptCache> pc;
  double cache_load_ms = 0;
  // A prompt longer than the cache wraps the ring while it is prefilled, and which tokens each chunk
  // still sees depends on where the chunks start (docs/kv-cache.md): resumed from a stored prefix, it
  // would not give the tokens a cold run gives. So it is neither looked up nor (below) stored.
  const bool overflows = p.tokens.size() > cache.capacity();
  if (c.persist.prompt_cache() && overflows)  // a warning, as the "not stored" it replaced
    std::fprintf(stderr, "vkllm: warning: prompt cache: not used (neither read nor written): the prompt's %s tokens overflow --ctx %s, so its prefill wraps the ring\n",
                 with_commas(p.tokens.size()).c_str(), with_commas(cache.capacity()).c_str());
  if (c.persist.prompt_cache() && !p.tokens.empty() && !overflows) {
    pc.emplace(pc_dir, prompt_cache_bytes, fp, cache.type_k(),
               cache.type_v());
    const auto t0 = std::chrono::steady_clock::now();
    const PromptCacheMatch m = pc->restore(p.tokens, *s.engine);
    cache_load_ms = ms_since(t0);
    print_cache_warnings(*pc);
    if (m.partial_skipped > m.matched)
      std::fprintf(stderr,
                   "vkllm: warning: prompt cache: a stored prompt shares %u tokens with this one, but this model's "
                   "sliding-window layers keep only their window, so only a whole stored prompt is reused (--swa-full "
                   "keeps every prefix reusable)\n",
                   m.partial_skipped);
    if (!c.opts.quiet) {
      if (m.entries_seen == 0) std::fprintf(stderr, "vkllm: prompt cache: no entry for this model and cache type yet\n");
      else if (m.matched < m.entry_tokens && m.matched < p.tokens.size())
        std::fprintf(stderr, "vkllm: prompt cache: %s%s\n", divergence_message(tok, p.tokens, m).c_str(),
                     m.worth_loading ? "" : " (not loaded: too little of it is shared to be worth reading)");
      else if (!m.worth_loading && m.matched > 1)
        std::fprintf(stderr, "vkllm: prompt cache: an entry of %s tokens begins with this prompt's %s, too little of it to be worth reading\n",
                     with_commas(m.entry_tokens).c_str(), with_commas(m.matched).c_str());
    }
  }
  if (!conv) {
    ProgressBar bar("prefill", "tok", c.opts.quiet);
    auto progress = [&](uint64_t done, uint64_t total) { bar.update(done, total); };
    if (resumed && !c.chat && appended.empty()) {
      if (cache.used() == 0)
        throw Error(c.persist.session + ": the session holds no tokens and the prompt is empty: nothing to continue from");
      gen.extend(appended);  // stats: the restored tokens count as cached
      gen.resume();
    } else if (resumed && !c.chat) {
      gen.extend(appended, progress);
    } else {
      gen.prefill(p.tokens, progress);
    }
  }
  // The draft's prefill comes before the first token: it counts in the time to it.
  double draft_ms = conv ? 0.0 : catch_up_draft(s, speculative, c.opts.quiet);
  // The prompt is stored once its prefill is done where generating could overwrite what an entry
  // needs: window rings' rows, or any row once the ring wraps (-n past the free slots, or -n -1);
  // otherwise after the generation, so that the write does not delay the first token.
  // (The prompt cache serves new prompts only, so there is no conversation here.) The write counts
  // in the time to the first token, as the load does.
  const uint32_t n_prompt = uint32_t(p.tokens.size());
  const bool may_wrap = c.n_predict == -1 || (c.n_predict >= 0 && uint64_t{n_prompt} + uint64_t(c.n_predict) > cache.capacity());
  bool stored = false;
  if (pc && (cache.window_ring() || may_wrap)) {
    const auto t0 = std::chrono::steady_clock::now();
    if (gen.stats().cached_tokens + 1 < n_prompt) pc->store(*s.engine, n_prompt);
    cache_load_ms += ms_since(t0);
    stored = true;
  }
  GenerateOptions go;
  go.n_predict = c.n_predict;
  go.stop = c.stop;
  go.ignore_eos = c.ignore_eos;
  go.logprobs = c.logprobs;
  go.top_logprobs = c.top_logprobs;
  go.grammar = grammar;
  go.logit_bias = logit_bias;
  go.speculative = speculative;
  std::string out, out_text;
  // Installed once the generation starts (a signal during the prefill ends the process at once) and
  // kept through the saves after it: a signal there lets the session and the prompt-cache entry be
  // written (it killed the process mid-save, the update lost) and sets the status. (Any file's
  // write holds the signals back while it runs: gguf::write_file_atomic.)
  std::optional<SignalsStopGeneration> stop_signals;
  {
    const TextSink sink = [&](const std::string& piece) {
      out_text += piece;
      if (c.json) {
        out += piece;
      } else {
        // Text that cannot be written (a full disk, a closed stdout) stops the generation; main()
        // reports it and exits 1.
        if (!write_stdout(piece)) return false;
      }
      return !stopped_by_signal();
    };
    // The flag is read at every token, not only when one prints (tokens of no text, or text held
    // back for a --stop prefix, would not reach the sink).
    if (conv) {
      // The turn's prefill and reply, as a chat's; the prefill's progress bar ends before the reply.
      std::optional<ProgressBar> bar(std::in_place, "prefill", "tok", c.opts.quiet);
      conv->say(text, go, sink, [&](uint64_t done, uint64_t total) { bar->update(done, total); },
                {[&] {
                   bar.reset();
                   draft_ms += catch_up_draft(s, speculative, c.opts.quiet);
                   warn_pin_cut(conv->pin_wanted(), conv->pinned(), cache);
                   stop_signals.emplace();
                 },
                 stopped_by_signal});
    } else {
      stop_signals.emplace();
      gen.generate(go, sink, stopped_by_signal);
    }
  }
  GenerationStats st = conv ? conv->last_stats() : gen.stats();
  st.ttft_ms += cache_load_ms + restore_ms + draft_ms;  // restoring and the draft's prefill are part of the time to the first token
  if (pc) {
    if (!stored && st.cached_tokens + 1 < n_prompt) pc->store(*s.engine, n_prompt);
    print_cache_warnings(*pc);
    if (!c.opts.quiet)
      std::fprintf(stderr, "vkllm: prompt %s tok · cached %s · TTFT %s\n", with_commas(st.prompt_tokens).c_str(),
                   with_commas(st.cached_tokens).c_str(), fmt_ms(st.ttft_ms).c_str());
  }
  std::string save_error;
  if (!c.persist.session.empty()) {
    std::string conv_json;
    if (c.chat && !conv) {
      messages.push_back({{"role", "assistant"}, {"content", out_text}});
      conv_json = nlohmann::json{{"messages", messages}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    // A failed save (a full disk) is reported after the output and the stats, which it would lose.
    try {
      const auto t0 = std::chrono::steady_clock::now();
      const uint64_t bytes =
          conv ? conv->save(c.persist.session, fp) : save_session(c.persist.session, *s.engine, fp, &sampler, conv_json, -1, &journal);
      if (!c.opts.quiet)
        std::fprintf(stderr, "vkllm: session %s: saved %s tokens, %s%s in %.1f ms\n", c.persist.session.c_str(),
                     with_commas(cache.used()).c_str(), human_bytes(bytes).c_str(), appended_note(conv ? conv->journal() : journal).c_str(),
                     ms_since(t0));
    } catch (const Error& e) {
      save_error = e.what();
    }
  }
  // The output after the saves is not held up by a signal (a blocked stdout would swallow a first
  // SIGTERM): the handlers go.
  stop_signals.reset();
  if (c.json) {
    nlohmann::json j = {
        {"text", out},
        {"tokens", st.tokens},
        {"prompt_tokens", st.prompt_tokens},
        {"cached_tokens", st.cached_tokens},
        {"skipped_tokens", st.skipped_tokens},
        {"generated_tokens", st.generated},
        {"stop_reason", st.stop_reason},
        {"ttft_ms", st.ttft_ms},
        {"prefill_tok_s", st.prefill_tok_s()},
        {"decode_tok_s", st.decode_tok_s()},
        {"kv_cache_type", cache_type_name(cache.type_k())},
        {"kv_bytes_per_token", cache.bytes_per_token()},
        {"kv_bytes_used", cache.bytes_used()},
        {"kv_tokens_used", cache.used()},
        {"kv_capacity", cache.capacity()},
        {"kv_evicted", cache.evicted()},
        {"seed", sampler.seed()},
    };
    if (speculative.on()) {
      j["draft_tokens"] = st.drafted;
      j["draft_accepted"] = st.draft_accepted;
    }
    if (c.logprobs) j["logprobs"] = st.logprobs;
    if (c.top_logprobs > 0) {
      // Per generated token, its step's most likely tokens: id, text (as the stream renders it), log-probability.
      nlohmann::json top = nlohmann::json::array();
      for (const std::vector<TokenLogprob>& step : st.top_logprobs) {
        nlohmann::json alternatives = nlohmann::json::array();
        for (const TokenLogprob& t : step)
          alternatives.push_back({{"token", t.token}, {"text", s.tokenizer->token_to_piece(t.token, false)}, {"logprob", t.logprob}});
        top.push_back(std::move(alternatives));
      }
      j["top_logprobs"] = std::move(top);
    }
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (!out.empty() || st.generated > 0) {
    if (stdout_is_tty()) std::printf("\n");
  }
  if (!c.opts.quiet && !c.json) print_stats(st, cache, speculative.on());
  if (c.opts.profile) print_profile(s.engine->timings());
  if (!save_error.empty()) throw Error(save_error);
  return stopped_by_signal() ? 128 + g_stop_signal.load() : 0;
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto c = std::make_shared<RunCommand>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt (stdin, -f FILE and -p TEXT, in that order)");
  add_model_options(cmd, c->opts);
  c->sampling_flags = add_sampling_options(cmd, c->opts.sampling);
  cmd->add_option("-p,--prompt", c->prompt, "Prompt text (after stdin and -f)");
  cmd->add_option("-f,--file", c->prompt_file, "Read the prompt from a file");
  add_n_predict_option(cmd, c->n_predict, "Tokens to generate");
  add_stop_option(cmd, c->stop, "the text");
  CLI::Option* chat = cmd->add_flag("--chat", c->chat, "Wrap the prompt in the model's chat template as a user message");
  cmd->add_option("--system", c->system, "System prompt (with --chat)")->needs(chat);
  cmd->add_option("--chat-template", c->chat_template, "Chat template: a built-in name or a Jinja file")->needs(chat);
  cmd->add_flag("--ignore-eos", c->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--special", c->special,
                "Parse special-token text in a raw prompt (\"</s>\" as the token), as llama-cli does; off: it is text, as in "
                "the references")
      ->excludes(chat);
  CLI::Option* json = cmd->add_flag("--json", c->json, "Print one JSON object with the text and statistics instead");
  CLI::Option* logprobs =
      cmd->add_flag("--logprobs", c->logprobs, "With --json: add each generated token's log-probability under the model (before penalties and temperature)")
          ->needs(json);
  cmd->add_option("--top-logprobs", c->top_logprobs, "With --logprobs: add each step's N most likely tokens (top_logprobs)")
      ->check(CLI::Range(1, 20))
      ->needs(logprobs);
  add_grammar_options(cmd, c->grammar);
  add_logit_bias_option(cmd, c->logit_bias);
  c->draft_flags = add_speculative_options(cmd, c->speculative, c->opts.model_draft);
  add_persistence_options(cmd, c->persist);
  cmd->callback([c] {
    if (const int code = run(*c); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace vkllm::cli
