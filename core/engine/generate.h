// Generation: prompt prefill with prefix reuse against the cache, the sampling loop, stop
// conditions and timing. Tokens leave through a callback; nothing is printed here.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

namespace vkllm {

struct GenerateOptions {
  // n_predict: a token count ≥ 0, or one of these limits. Every limit also stops at end of generation.
  static constexpr int32_t kEndless = -1;    // on through the ring, evicting the oldest tokens
  static constexpr int32_t kUntilFull = -2;  // until the cache is full (see generation_budget)
  int32_t n_predict = kUntilFull;
  std::vector<std::string> stop;      // stop strings (not included in the output; empty ones ignored)
  bool ignore_eos = false;
  bool logprobs = false;              // record each generated token's log-probability (GenerationStats::logprobs)
  uint32_t top_logprobs = 0;          // with logprobs: also each step's this many most likely tokens
  // kUntilFull: this turn's own prompt tokens, where the prefill ran more than them (a chat that
  // refilled its ring with earlier turns); -1: the tokens the prefill ran (generation_budget).
  int64_t turn_tokens = -1;
  // Generated text must follow this grammar (docs/sampling.md, "Grammars"); null: free text.
  std::shared_ptr<const Grammar> grammar;
  // Added to these tokens' logits before the sampling chain (llama.cpp's logit_bias, first in its
  // chain); −inf bans a token. Ids are checked against the vocabulary by the front end.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Speculative decoding (docs/speculative.md): the tokens are the ones plain steps would give.
  SpeculativeOptions speculative;
};

// A token and its log-probability under the model's logits (before penalties and temperature).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct GenerationStats {
  uint32_t prompt_tokens = 0;     // tokens of the prompt
  uint32_t cached_tokens = 0;     // of which reused from the cache
  uint32_t skipped_tokens = 0;    // of which not run: a chat's turn whose conversation overflows the ring
                                  // runs only the newest window's worth (the ring would drop the others)
  uint32_t generated = 0;         // tokens sampled
  double prefill_ms = 0;          // running the uncached prompt tokens
  double ttft_ms = 0;             // prefill + first token sampled
  double decode_ms = 0;           // from the first token sampled to the last one run
  uint32_t drafted = 0;           // speculative draft tokens run through the model
  uint32_t draft_accepted = 0;    // of which the sampling took (the rest were cut from the cache)
  std::string stop_reason;        // "eos", "length", "context full", "stop string", "interrupted"
  std::vector<int32_t> tokens;    // generated token ids
  std::vector<float> logprobs;    // with GenerateOptions::logprobs: each token's log-probability under the
                                  // model's logits (before penalties and temperature)
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // with top_logprobs n > 0: each step's n most likely
                                                        // tokens, most likely first (ties: lower id first)
  std::vector<uint32_t> text_start;  // with logprobs: the byte of the generated text where each token's text
                                     // starts (counted before a stop string cuts the text)
  uint32_t prefilled() const { return prompt_tokens - cached_tokens - skipped_tokens; }  // tokens the prefill ran
  double prefill_tok_s() const { return prefill_ms > 0 ? prefilled() * 1000.0 / prefill_ms : 0; }
  double decode_tok_s() const { return decode_ms > 0 ? generated * 1000.0 / decode_ms : 0; }
};

// Where a new prompt diverges from what the cache holds (for the prefix-reuse messages).
struct PrefixMatch {
  uint32_t matched = 0;  // leading tokens shared
  bool usable = true;    // false once the ring has evicted tokens: the cache is no longer a prefix
};
PrefixMatch match_prefix(const KvCache& cache, std::span<const int32_t> tokens);
// The leading tokens of `prompt` a prefill reuses from the cache: its match, less the prompt's last
// token (one always runs, so its logits are fresh), cut to what the window rings still hold
// (KvCache::reusable); 0 once the ring has evicted. What prefill_begin() keeps.
uint32_t reusable_prefix(const KvCache& cache, std::span<const int32_t> prompt);

// How many tokens a kUntilFull generation may add: the free slots when the cache is not yet full
// (llama.cpp stops there too); when it already is (the ring wrapped during this prompt or an earlier
// turn), the ring slots not taken by this turn's own tokens, so a reply evicts earlier turns but
// never its own prompt. `turn_tokens` are the tokens this prefill or extend added.
uint32_t generation_budget(const KvCache& cache, uint32_t turn_tokens);

// Receives generated text as it becomes final; returns false to interrupt.
using TextSink = std::function<bool(const std::string&)>;

// Thrown by a ProgressFn to stop a prefill between its chunks (Ctrl+C during a long prompt): the
// chunks that ran are in the cache, in order, and the engine is ready for more.
struct PrefillInterrupted {};

class Generator {
 public:
  // Binds `sampler` to the vocabulary (DRY finds its sequence breakers in it).
  Generator(Engine& engine, const Tokenizer& tok, Sampler& sampler);

  // Makes the cache hold `prompt` (keeping the longest prefix it already holds) and leaves the
  // logits of its last token ready. Returns the number of reused tokens.
  uint32_t prefill(std::span<const int32_t> prompt, const ProgressFn& progress = {});
  // Appends `tokens` to whatever the cache holds, without looking for a shared prefix (a chat
  // keeps its own account of what is cached, which still works after the ring has evicted), and
  // leaves the logits of the last one ready. Returns the tokens that were already cached.
  uint32_t extend(std::span<const int32_t> tokens, const ProgressFn& progress = {});
  // After an extend, the account of a chat turn whose prompt is the whole conversation (`prompt`
  // tokens): `cached` of them stayed in the cache, and `ran_before` more were run before the
  // extend, in `ran_before_ms` (the pin of a refilled ring); the rest the extend did not run are
  // skipped.
  void account_turn(uint32_t prompt, uint32_t cached, uint32_t ran_before, double ran_before_ms);
  // prefill() in steps, for a caller that interleaves a prompt with other work (the server runs
  // a chunk between decode steps of the other sequences): prefill_begin() keeps the longest
  // cached prefix as prefill() does and returns the reused tokens; each prefill_step() runs at
  // most `max_tokens` of the rest and returns whether any remain. The stats cover all steps.
  uint32_t prefill_begin(std::span<const int32_t> prompt);
  bool prefill_step(uint32_t max_tokens, const ProgressFn& progress = {});
  // After the cache was restored from disk: recomputes the last cached token's logits (truncate
  // by one, decode it again, the pinned prefix unchanged) so generate() continues exactly where
  // the saved run stopped. The token's K/V rows are rewritten with the same values.
  void resume();
  // Samples until a stop condition (with GenerateOptions::speculative, several tokens per pass
  // where drafts are taken); `on_text` receives decoded text as it becomes final (never
  // half a UTF-8 character or a possible stop-string prefix) and returns false to interrupt.
  // `stop`, when given, is read before every token (tokens of no text included): true ends the
  // generation as an interrupt.
  void generate(const GenerateOptions& o, const TextSink& on_text, const std::function<bool()>& stop = {});
  // The same a token at a time, so one thread can interleave several generations (the server):
  // start(), then step() until it returns false. Each step samples one token, runs it through
  // the model and releases the text that became final; the last step flushes what was held back.
  // A speculative step runs a token with a draft after it and takes every token the sampling
  // agrees with; one that disagrees is run by the same step, so no sampled token waits between steps.
  void start(const GenerateOptions& o);
  bool step(const TextSink& on_text);
  // A step in two halves, for a caller that runs the token through the model itself (the
  // server's decode step of several sequences): sample() returns the token to run, or −1 when
  // the generation ended (limit, end of generation); advance() takes that token's logits.
  int32_t sample(const TextSink& on_text);
  bool advance(std::span<const float> logits, const TextSink& on_text);
  // Whether the running generation speculates: it asked to, and the engine's verify passes give
  // each token the logits it would get alone (Engine::verify_exact); otherwise it steps plainly.
  bool speculating() const;
  // A speculative step's halves, for a caller that runs the pass itself (the server's step of
  // several sequences, each with its draft; step() runs them with decode_columns): the draft to
  // run after the sampled token (empty: none pays or fits; `cost`: what a pass of n tokens costs,
  // where the caller knows, DraftLength::choose), then the pass's logits (a row for tok
  // and each draft token, which the pass appended to the cache) taken with what the pass cost
  // this generation: every token the sampling agrees with is taken and the refused drafts are cut
  // from the cache. Returns whether the generation goes on; a token sampled against a draft is
  // the next sample().
  std::vector<int32_t> draft(int32_t tok, const RelativeCost& cost = {});
  bool take_pass(std::span<const int32_t> pass, std::span<const float> logits, double ms, const TextSink& on_text);
  // Ends a started generation before its next step (its client went away): "interrupted".
  void interrupt();
  // The vocabulary as grammars read it, from a caller that keeps one for many generators (the
  // server); otherwise the first run with a grammar decodes its own.
  void share_grammar_vocab(std::shared_ptr<const GrammarVocab> vocab) { grammar_vocab_ = std::move(vocab); }

  const GenerationStats& stats() const { return stats_; }
  GenerationStats& stats() { return stats_; }

 private:
  // The state of the generation between start() and the step that ends it.
  struct Run {
    GenerateOptions opts;
    StreamDecoder decoder;
    std::string pending;  // decoded text not yet released (a possible stop-string prefix)
    int64_t limit = 0;    // tokens it may sample (< 0: no limit)
    int64_t sampled = 0;
    int32_t token = -1;   // the last token sampled
    int32_t next = -1;    // a token sampled against a refused draft, to run next (−1: none)
    uint32_t decoded = 0; // bytes of text decoded so far (before a stop string cuts it)
    std::optional<GrammarMatcher> grammar;  // where the text stands in opts.grammar
    std::chrono::steady_clock::time_point t_start, t_first;
    bool draft_cut = false;  // the last draft() ended before the length chosen (DraftLength::observe)
  };
  // A verify pass of the sampled token and its draft (draft(), decode_columns, take_pass).
  bool speculate(int32_t tok, const TextSink& on_text);
  // Releases the held-back text and the timing at the end of a run.
  void finish(const TextSink& on_text);
  // The sampler's choice under the run's grammar (llama.cpp's order: see generate.cpp).
  int32_t sample_in_grammar(GrammarMatcher& grammar);
  // extend()'s bookkeeping: the stats, the sampler's history, the tokens left to run.
  uint32_t extend_begin(std::span<const int32_t> tokens);
  // Removes the cache's newest `count` tokens, keeping its pin.
  void drop_newest(uint32_t count);
  Engine& engine_;
  const Tokenizer& tok_;
  Sampler& sampler_;
  std::vector<float> logits_;  // of the last token in the cache
  std::vector<float> raw_;     // the logits before the sampler's penalties (logprobs)
  std::vector<float> unmasked_;  // the logits before a draw the grammar refused
  std::shared_ptr<const GrammarVocab> grammar_vocab_;  // built by the first run with a grammar
  std::optional<DraftLength> draft_length_;  // what speculation measured, kept across generations
  std::vector<int32_t> to_run_;  // the prompt tokens a prefill runs (prefill_step) …
  size_t run_done_ = 0;          // … and how many of them ran (the cache's count stops at a full ring)
  GenerationStats stats_;
  std::optional<Run> run_;
};

}  // namespace vkllm
