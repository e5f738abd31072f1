// Sampler: turns one step's logits into the next token (llama.cpp's default chain, on the CPU).
//
// Chain (the order of llama.cpp's common_sampler): penalties -> top-k -> top-p -> min-p ->
// temperature -> draw from the softmax. temp <= 0 is greedy: penalties, then argmax.
// See docs/sampling.md for the semantics of each step and the saved-state format.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

namespace vkllm {

struct SamplerParams {
  float temp = 0.8f;              // <= 0: greedy (argmax, first index on ties)
  int32_t top_k = 40;             // <= 0: off
  float top_p = 0.95f;            // >= 1: off
  float min_p = 0.05f;            // <= 0: off; keeps p >= min_p * p_max
  float repeat_penalty = 1.0f;    // 1: off; a seen token's logit l becomes l > 0 ? l / r : l * r
  float frequency_penalty = 0.0f; // 0: off; subtracted once per occurrence in the window
  float presence_penalty = 0.0f;  // 0: off; subtracted once if the token occurs in the window
  int32_t repeat_last_n = 64;     // window of previous tokens the penalties look at (0: off, -1: all)
  uint64_t seed = 0xFFFFFFFF;     // kRandomSeed: a random seed from the OS
};

// One surviving candidate after the chain: token id, its (penalised, tempered) logit and its
// probability under the softmax over the survivors.
struct Candidate {
  int32_t id;
  float logit;
  float p;
};

class Sampler {
 public:
  static constexpr uint64_t kRandomSeed = 0xFFFFFFFF;

  // Throws vkllm::Error when a parameter is out of range (NaN, repeat_penalty <= 0, ...).
  explicit Sampler(const SamplerParams& p);
  // The same check alone, for a front end that refuses its flags before it loads anything.
  static void validate(const SamplerParams& p);

  // Chooses the next token from logits [n_vocab] f32 (the span is modified in place: the
  // penalties are applied to it). Greedy draws no random number.
  int32_t sample(std::span<float> logits);

  // The candidates the draw would choose from, with their probabilities (sum 1), in chain order:
  // sorted by logit descending (ties: lower id first) when top-k or top-p ran, else by id.
  // Greedy gives the argmax alone. Applies the penalties to `logits`; touches no RNG.
  std::vector<Candidate> candidates(std::span<float> logits) const;

  void accept(int32_t token);  // record a token (prompt or generated) for the penalties; < 0 ignored
  void reset();                // forget the history (RNG untouched)
  // The penalty history, oldest first, and a way back to one (a chat's /regen and /undo rewind
  // it to where the turn began); set_history keeps the last repeat_last_n of `tokens`.
  std::vector<int32_t> history() const { return {history_.begin(), history_.end()}; }
  void set_history(std::span<const int32_t> tokens);

  // Serialised state for session files: params, the penalty history and the full RNG state, so
  // a restored sampler continues with exactly the same choices (same standard library).
  // restore_state() validates everything and throws vkllm::Error on a malformed blob; on a
  // throw the sampler is unchanged.
  std::vector<uint8_t> save_state() const;
  void restore_state(std::span<const uint8_t> blob);

  // New parameters for what comes next (a resumed session's sampling flags): validated first
  // (throws, unchanged); the penalty history is cut to a shorter repeat_last_n; `reseed` draws
  // the RNG from p.seed as the constructor does, else it goes on where it was.
  void set_params(const SamplerParams& p, bool reseed);

  const SamplerParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }  // the seed actually used

 private:
  void apply_penalties(std::span<float> logits) const;
  bool penalties_on() const;

  void seed_rng(uint64_t seed);
  // Drops the oldest history past repeat_last_n (all of it at 0).
  void trim_history();

  SamplerParams params_;
  uint64_t seed_ = 0;
  std::mt19937 rng_;
  std::deque<int32_t> history_;                     // the last repeat_last_n accepted tokens
  std::unordered_map<int32_t, int32_t> counts_;     // token -> occurrences in history_
};

}  // namespace vkllm
