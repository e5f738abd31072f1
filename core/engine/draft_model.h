// Speculative decoding with a draft model (llama.cpp's -md/--model-draft): a smaller model of
// the same vocabulary runs greedily ahead of the target, and the target verifies its tokens in
// one pass (Generator::take_pass keeps only what plain sampling would have produced).
// docs/speculative.md, "Draft models".
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/speculative.h"
#include "text/tokenizer.h"

namespace vkllm {

// Why `draft`'s tokenizer cannot draft for `target`'s ("" where it can), with llama.cpp's rules
// (common_speculative_are_compatible): the same tokenizer model, the same BOS/EOS ids and whether
// they are added, vocabularies within 128 tokens of each other, and the same text for every id
// from 5 up to the smaller vocabulary (ids 0–4 are control tokens some conversions renumber).
std::string draft_vocab_mismatch(const Tokenizer& target, const Tokenizer& draft);

// Whether a generation with these options would run its draft model on `engine` now: it drafts with
// a model, the engine verifies drafts exactly (Engine::verify_exact), and the cache has room for a
// draft (drafts never make the ring evict). Where not, catching the draft's cache up is wasted.
bool drafts_with_model(const SpeculativeOptions& s, const Engine& engine);

// The draft model's side: its own engine and KV cache, which follows the target's tokens. Each
// proposal first brings its cache to the target's context (the longest prefix it still holds is
// kept, the rest runs as a prompt chunk), then decodes greedily, one token per step.
class DraftModel {
 public:
  // `engine` runs the draft model (its cache at least the target's capacity); `target_vocab` bounds
  // the ids a draft may hold; `unknown` is the draft's id for a context token past its own
  // vocabulary (a draft vocabulary may be up to 128 tokens smaller); `prior_ratio` is what a draft
  // pass costs against a target step before any is measured (the ratio of the weights' bytes: what
  // a step reads).
  DraftModel(Engine& engine, int32_t target_vocab, int32_t unknown, double prior_ratio);

  // At most `max` tokens that follow `context`, each the draft model's most likely next token,
  // stopping before one whose probability is under p_min (llama.cpp's --draft-p-min). `context`
  // (the target's tokens and the token just sampled) plus max − 1 tokens must fit the draft's cache.
  std::vector<int32_t> propose(std::span<const int32_t> context, uint32_t max, float p_min);
  // Brings the draft's cache to `context` now (the longest prefix it holds kept, the rest run in
  // chunks, `progress` told after each): a front end calls it after a long prompt's prefill, so the
  // first draft does not run the whole prompt unannounced in the middle of the reply.
  void catch_up(std::span<const int32_t> context, const ProgressFn& progress = {});
  // The same a chunk at a time, for a caller that interleaves it with other work (the server's
  // prefill rounds): runs at most `max_tokens` of what the cache lacks of `context` less its last
  // token (which the next proposal runs) and returns whether any remain.
  bool catch_up_step(std::span<const int32_t> context, uint32_t max_tokens);

  // A draft pass's cost in target steps of `target_step_ms`: the measured passes with the prior
  // weighing as one (the prior alone until a target step is measured).
  double cost_ratio(double target_step_ms) const;
  // A step that asked no draft: the measurements fade a little toward the prior, so that a cost once
  // measured too high (a slow first draft) does not keep the draft model unasked for good.
  void fade();

  Engine& engine() { return engine_; }

 private:
  // catch_up() less the timing: returns the logits of the context's last token.
  const std::vector<float>& sync(std::span<const int32_t> context, const ProgressFn& progress);
  // The context in the draft's vocabulary: ids past it become `unknown_`.
  std::span<const int32_t> in_vocab(std::span<const int32_t> context);
  Engine& engine_;
  int32_t target_vocab_, draft_vocab_, unknown_;
  std::vector<int32_t> mapped_;  // in_vocab()'s copy, where one was needed
  double prior_ratio_;
  double ms_ = 0, passes_ = 0;  // decaying sums of the proposals' time and passes
};

}  // namespace vkllm
