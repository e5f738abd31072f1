// Speculative decoding's drafts: without a draft model (llama.cpp's `--spec-type ngram-simple`),
// the tokens that followed the last earlier occurrence of the context's final n-gram; with one
// (`--model-draft`, engine/draft_model.h), its greedy tokens. Their length is chosen from the
// acceptance and the verify-pass cost measured so far. docs/speculative.md.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace vkllm {

class DraftModel;

enum class SpecType { None, NgramSimple, DraftModel };

struct SpeculativeOptions {
  SpecType type = SpecType::None;
  uint32_t ngram_n = 4;    // tokens of the key n-gram (--spec-ngram-size-n)
  uint32_t ngram_m = 48;   // the most tokens one match proposes (--spec-ngram-size-m)
  uint32_t draft_max = 16; // the most draft tokens a verify pass runs (--draft-max)
  uint32_t draft_min = 0;  // a draft runs at least this long, or not at all (--draft-min)
  // SpecType::DraftModel: the model that drafts (owned by the caller), and the probability under
  // which its next token ends a draft (--draft-p-min; llama.cpp's default).
  DraftModel* draft_model = nullptr;
  float p_min = 0.8f;
  bool on() const { return type != SpecType::None; }
};

// ngram-simple: the tokens that followed the most recent earlier occurrence of the last `n`
// tokens of `history`, at most `max` of them. A continuation that runs into the history's end
// goes on with the draft itself (a repeating cycle drafts its next period). Empty when the
// history is shorter than n + 1 or the n-gram has not occurred before.
std::vector<int32_t> ngram_draft(std::span<const int32_t> history, uint32_t n, uint32_t max);

// How many draft tokens a verify pass should run, from what the passes so far measured: the
// rate at which a drafted token is accepted (given the ones before it were), and what a pass of
// n tokens costs against a pass of one. A pass of k drafts yields 1 + a + … + a^k tokens on
// average; the length kept is the one with the most tokens per unit of time, 0 where no length
// beats a plain step. Costs are measured per pass length (a CPU driver's matvec runs columns in
// fours, so 2 cost what 4 do); a length not measured yet costs 1 + (n − 1)·prior_rho steps, and
// never less than a shorter pass measured.
// What a pass of n tokens costs, in passes of one token.
using RelativeCost = std::function<double(uint32_t n)>;

class DraftLength {
 public:
  // prior_rho: a pass's marginal token, in steps, before any measurement (0.3: lavapipe's, where
  // speculation runs for now: docs/speculative.md). prior_accept: the acceptance before any draft
  // ran, weighing as two drafted positions (one half for n-grams; a draft model's tokens, drafted
  // only where it gives them at least --draft-p-min, start at that).
  explicit DraftLength(double prior_rho = 0.3, double prior_accept = 0.5) : prior_accept_(prior_accept), prior_rho_(prior_rho) {}
  // The length to run for a draft of `available` tokens (already cut to draft_max): the best, but
  // at least draft_min, and 0 when fewer than draft_min are available. `cost`, where given, is
  // what a pass of n tokens costs in one-token passes in place of relative_cost (the server's
  // steps of several sequences: PassCost).
  uint32_t choose(uint32_t available, uint32_t draft_min, const RelativeCost& cost = {}) const;
  // A pass ran n tokens (1 + drafts) in `ms`, and `accepted` of its drafts were taken. A pass
  // whose cost is not the generation's own (ms ≤ 0: a server step of several sequences, whose
  // choice takes PassCost) counts for the acceptance only. `cut_short`: the draft ended before the
  // length chosen (a draft model under --draft-p-min), which counts as one more position refused
  // where all the drafts were taken (or where none was drafted).
  void observe(uint32_t n, uint32_t accepted, double ms, bool cut_short = false);
  double acceptance() const { return (hits_ + 2.0 * prior_accept_) / (tries_ + 2.0); }
  // What a pass of n tokens costs, in one-token passes (estimated where not measured).
  double relative_cost(uint32_t n) const;
  // The measured ms of a one-token pass (0: none measured yet).
  double step_ms() const { return cost_ms_.size() > 1 ? cost_ms_[1] : 0.0; }

 private:
  double hits_ = 0, tries_ = 0;  // drafted positions taken, of those tried (decaying counts)
  double prior_accept_;
  double prior_rho_;
  std::vector<double> cost_ms_;  // [n]: a pass of n tokens, a moving average (0: not measured)
};

// What a forward pass of n tokens costs, as a fixed part (the weights read once, the dispatches)
// and a part per token: ms ≈ fixed + per_token · n, a line through the moving averages of the
// lengths measured (a length measured alone: per_token taken as prior_rho of a one-token pass).
// The server's step runs several sequences' tokens in one pass; a sequence's share of it
// (share()) is an even part of the fixed cost and the per-token cost of its own tokens, which is
// what its tokens cost the step: a draft length that raises its tokens per share raises the
// step's tokens per second (docs/server.md, "Speculative decoding").
class PassCost {
 public:
  explicit PassCost(double prior_rho = 0.3) : prior_rho_(prior_rho) {}
  void observe(uint32_t n, double ms);
  struct Line {
    double fixed = 0, per_token = 0;
  };
  Line line() const;  // {0, 0} before any measurement
  // The ms of a step's pass that `n` of its tokens, for one of `sequences` sequences, cost.
  double share(uint32_t n, uint32_t sequences) const;
  // share(n, sequences) in shares of one token (empty before any measurement), for DraftLength.
  RelativeCost relative(uint32_t sequences) const;

 private:
  double prior_rho_;
  std::vector<double> ms_;  // [n]: a pass of n tokens, a moving average (0: not measured)
};

}  // namespace vkllm
