// Scheduler: the server's sequences and the one thread that runs them on the device.
//
// Each sequence is an Engine of its own (its own KV cache and activations; the weights are
// shared) with the tokens of the last request it ran still cached. A request waits in a bounded
// queue until a sequence is free, then takes the free sequence whose cache shares the longest
// prefix with its prompt (if that reuses at least half of what the cache holds; else, and on
// ties, the one idle longest), prefills only what differs (or loads a
// longer prefix from the on-disk prompt cache), and joins the running sequences. Each round the
// device thread runs one prefill chunk (of the request admitted first among those still
// prefilling), then advances every generating sequence by one token in one decode step that
// reads the weights once for all of them: a long prompt delays the others' tokens by a chunk per
// round instead of stopping them for its whole prefill. Every column of that step is computed
// exactly as it would be alone, so a request's tokens never depend on what else runs (greedy, or
// a fixed seed).
// Design in docs/server.md.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/dry.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "serve/logprobs.h"
#include "serve/metrics.h"
#include "store/prompt_cache.h"
#include "store/session_file.h"
#include "text/tokenizer.h"

namespace vkllm::serve {

// One request's work and its way back to the HTTP thread that waits on it.
class Job {
 public:
  Job(std::vector<int32_t> prompt, SamplerParams sampling, GenerateOptions generate)
      : prompt(std::move(prompt)), sampling(sampling), generate(std::move(generate)) {}

  const std::vector<int32_t> prompt;
  const SamplerParams sampling;
  const GenerateOptions generate;
  const std::chrono::steady_clock::time_point enqueued = std::chrono::steady_clock::now();

  // The HTTP side: waits at most `timeout` for text released since the last call (Text: in `out`,
  // with the released tokens' log-probabilities in `logprobs` when the request asked for them) or
  // the end (Done: everything was taken, stats()/error() are final). Idle: nothing came, and the
  // response writes something its client skips (an SSE comment, a space before the JSON), which
  // is how it notices a client that went away while its request was queued or running.
  enum class Wait { Text, Idle, Done };
  Wait wait_text_for(std::string& out, std::chrono::milliseconds timeout, std::vector<TokenLogprobs>* logprobs = nullptr);
  // The client went away: the device thread drops the sequence at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  const GenerationStats& stats() const { return stats_; }
  const std::string& error() const { return error_; }
  // The error was the request's (its grammar could not go on): a 400, not a 500.
  bool request_error() const { return request_error_; }

  // The device side.
  void push_text(const std::string& text, std::vector<TokenLogprobs> logprobs = {});
  void finish(const GenerationStats& stats, std::string error = "", bool request_error = false);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  std::vector<TokenLogprobs> logprobs_;
  bool done_ = false;
  std::atomic<bool> cancelled_{false};
  GenerationStats stats_;
  std::string error_;
  bool request_error_ = false;
};

// What GET /slots shows of a sequence, as of the end of the device thread's last round.
struct SlotState {
  size_t id = 0;
  uint32_t n_ctx = 0;       // tokens its cache holds at most (--ctx)
  bool processing = false;  // running a request
  bool prefilling = false;  // … and still running its prompt
  uint32_t n_cached = 0;    // tokens its cache holds (the last request's, once it is done: what a next one may reuse)
  // The running request (null when idle), for its parameters, and the tokens it has generated.
  std::shared_ptr<const Job> job;
  uint32_t n_decoded = 0;
};

// llama-server's POST /slots/{id}?action=save|restore|erase: one sequence's cache to a session
// file (core/store/session_file.h) and back, run by the device thread between its rounds while the
// sequence is idle. A restored cache is what the next request sharing its prefix reuses.
struct SlotAction {
  enum class Kind { Save, Restore, Erase };
  Kind kind = Kind::Save;
  size_t slot = 0;
  std::string path;  // the session file (save, restore)
};
struct SlotResult {
  int status = 200;     // an HTTP status: 503 while the sequence runs a request, 404 no such file, 400 a file that is
                        // refused, 500 a save or a read that failed
  std::string error;    // "" when done
  uint32_t tokens = 0;  // saved, restored or erased
  uint64_t bytes = 0;   // a save's bytes written; a restore's file size
  uint64_t unfinished = 0;  // a restore's: bytes of a save cut short after the file's last whole one (ignored)
  double ms = 0;
};

struct SchedulerOptions {
  size_t max_queue = 64;             // waiting requests beyond the running ones; more are refused
  PromptCache* prompt_cache = nullptr;  // --prompt-cache: prefixes on disk (used by the device thread only)
  const ModelFingerprint* fingerprint = nullptr;  // the model's, for slot files (SlotAction)
  std::function<void(const std::string&)> log;  // one line of diagnostics (the front end prints it)
  // -md: each sequence's draft model (its own draft cache), in the engines' order; empty: none.
  std::vector<DraftModel*> drafters;
};

class Scheduler {
 public:
  // Takes the engines (one per sequence); starts the device thread.
  Scheduler(std::vector<Engine*> engines, const Tokenizer& tok, Metrics& metrics, const SchedulerOptions& o);
  ~Scheduler();

  // Queues a job; false when the queue is full or the scheduler is draining (the caller answers 503).
  bool submit(const std::shared_ptr<Job>& job);
  // Stops taking jobs; returns once every queued and running job has finished.
  void drain();
  bool draining() const { return draining_; }
  size_t sequences() const { return seqs_.size(); }
  uint32_t context() const;
  // Every sequence's state (SlotState).
  std::vector<SlotState> slots();
  // Runs `a` on the device thread before its next round; the future holds how it went.
  std::future<SlotResult> slot_action(const SlotAction& a);

 private:
  struct Sequence {
    Engine* engine;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<Generator> gen;
    std::shared_ptr<Job> job;  // the running request (null: idle)
    uint64_t last_used = 0;    // round of its last request, for the choice among idle ones
    double ttft_s = -1;        // the job's arrival to its first token (< 0: not yet)
    bool prefilling = false;   // its prompt has tokens left to run
    uint64_t admitted = 0;     // admission order: the earliest prefilling job runs its chunk first
    uint64_t released = 0;     // bytes of the job's text released to it
    size_t reported = 0;       // its generated tokens whose log-probabilities were released
    SessionJournal journal;    // the slot file it last saved or restored, so that a save appends
    DraftModel* draft = nullptr;  // -md: the draft model of its requests (SpecType::DraftModel)
  };
  void loop();
  // The slot actions waiting, in order (device thread).
  void run_actions();
  SlotResult run_action(const SlotAction& a);
  // Starts a job on an idle sequence: prefix reuse (from its cache or the prompt cache); the rest
  // of the prompt runs in prefill_round().
  void admit(Sequence& s, const std::shared_ptr<Job>& job);
  // Where another sequence (running or not) holds a longer prefix of the prompt than s's own
  // cache, its K/V rows of that prefix replace s's cache (a device → host → device copy).
  void copy_longer_prefix(Sequence& s, std::span<const int32_t> prompt);
  // One prefill chunk (the engine's ubatch) of the earliest admitted sequence still prefilling;
  // the last one sets up its generation.
  void prefill_round();
  void finish_prefill(Sequence& s);
  // One token of every running sequence, and the draft after it of each that speculates (its
  // request's GenerateOptions::speculative: the server's flags, per request), in one
  // decode step (Engine::decode_batch: the weights read once for all of them); finishes the jobs
  // that end.
  void step_all();
  TextSink sink(Sequence& s);
  // With logprobs asked for: the entries of the generated tokens whose text has begun to be
  // released (all of them with `all`, at the end of a generation whose text was not cut).
  std::vector<TokenLogprobs> released_logprobs(Sequence& s, bool all);
  void complete(Sequence& s, const std::string& error = "", bool request_error = false);
  void update_gauges();
  // Drops the queued jobs whose clients went away (mu_ held): they held queue places until a
  // sequence took them, so a client retrying after its own timeout was refused.
  void drop_cancelled_locked();

  const Tokenizer& tok_;
  std::shared_ptr<const GrammarVocab> grammar_vocab_;  // built by the first request with a grammar
  std::shared_ptr<const DryBreakers> dry_breakers_;    // DRY's breakers for dry_breaker_list_, the last list a request used
  std::vector<std::string> dry_breaker_list_;
  Metrics& metrics_;
  SchedulerOptions opts_;
  std::vector<Sequence> seqs_;
  std::mutex mu_;
  std::condition_variable cv_;      // work arrived, or stop
  std::condition_variable idle_cv_; // a job finished (drain waits on it)
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<SlotState> slots_;  // the sequences as of the last round (mu_ held)
  std::deque<std::pair<SlotAction, std::promise<SlotResult>>> actions_;  // waiting slot actions (mu_ held)
  size_t running_ = 0;
  uint64_t round_ = 0;
  uint64_t admissions_ = 0;  // device thread only
  PassCost pass_cost_;  // what the steps' passes cost, by their tokens (device thread only)
  std::atomic<bool> draining_{false};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace vkllm::serve
