// What `vkllm run` and `vkllm chat` share for --session and --prompt-cache: flags, the stderr
// lines, and the divergence message.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <span>
#include <string>

#include "common.h"
#include "store/prompt_cache.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"

namespace vkllm::cli {

struct PersistenceOptions {
  std::string session;                      // --session FILE ("" = none)
  CLI::Option* prompt_cache_opt = nullptr;  // --prompt-cache, which may come without a value
  std::string prompt_cache_dir;             // its value ("" = default_prompt_cache_dir())
  std::string prompt_cache_size = "2GiB";   // --prompt-cache-size
  bool prompt_cache() const { return prompt_cache_opt && prompt_cache_opt->count() > 0; }
};

// --session, --prompt-cache [DIR], --prompt-cache-size.
void add_persistence_options(CLI::App* cmd, PersistenceOptions& o);
// --prompt-cache [DIR] and --prompt-cache-size alone (`vkllm serve`).
void add_prompt_cache_options(CLI::App* cmd, PersistenceOptions& o);
// --session alone (`vkllm chat`).
void add_session_option(CLI::App* cmd, std::string& session);
// Before the model loads: a --session path that exists must be a regular file (throws Error).
void check_session_path(const std::string& session);
// Before the weights load (open_session's input check), for a session to resume: its header and
// token list read and checked, its model against `model` (with o's RoPE flags) and its cache types
// against o's, so that a file of another model, another cache type or with a damaged head is
// refused at once, not after a load of minutes (its rows are checked when it is loaded). Returns
// the model's fingerprint, which the save needs too.
ModelFingerprint precheck_session(const std::string& session, const gguf::File& model, uint32_t n_ctx, const RunOptions& o);
// Before the load, for a session to resume and a command line that names no cache type: `o` with
// the session's own (a q8_0 session resumed without --cache-type q8_0 was refused after the load).
RunOptions with_session_cache_type(const std::string& session, RunOptions o);
// Whether --session names a saved session to continue: a file that exists and is not empty. An
// empty one (as `mktemp` makes) starts a new session, as llama.cpp's --prompt-cache does, with a
// note unless quiet; the save then fills it.
bool session_to_resume(const std::string& session, bool quiet);
// Refuses a --prompt-cache that names an existing file (llama.cpp's --prompt-cache is a state file).
void check_prompt_cache_dir(const std::string& dir);
// The directory --prompt-cache uses; throws when none can be determined, naming `option` (the
// flag that gives one: `cache`'s is --dir).
std::string prompt_cache_dir(const PersistenceOptions& o, const std::string& option = "--prompt-cache");
// "2GiB", "512M", "1000000" → bytes; throws Error naming the flag.
uint64_t parse_size(const std::string& flag, const std::string& text);

// "matched 3 of 2,113 tokens: the prompt differs from the cached one at token 3, '…2026-11-30…'"
std::string divergence_message(const Tokenizer& tok, std::span<const int32_t> prompt, const PromptCacheMatch& m);
// A restored session samples with its saved sampler (parameters and RNG): the line that says so
// when the flags asked for another one, or "" when they agree.
// A resumed session's sampler goes on with its saved parameters and RNG, but for the sampling
// flags the command line gave (`given`, add_sampling_options' options): those replace the saved
// values, and --seed reseeds the RNG. Returns the line to print, "" when none was given.
std::string apply_sampling_flags(const std::string& session, Sampler& restored, const SamplerParams& flags,
                                 std::span<CLI::Option* const> given);
// "vkllm: warning: …" for each warning not printed yet.
void print_cache_warnings(PromptCache& pc);
// "; its last save did not finish: N bytes after offset X ignored (the next save cuts them off)" for a
// session whose last appended update was cut short (SessionInfo::unfinished_bytes), else "".
std::string unfinished_save_note(const SessionInfo& info);
// " (N appended)" when the journal's last save appended, else "".
std::string appended_note(const SessionJournal& journal);

}  // namespace vkllm::cli
