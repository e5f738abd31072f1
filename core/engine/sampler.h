// Sampler: turns one step's logits into the next token (llama.cpp's default chain, on the CPU).
//
// Chain (the order of llama.cpp's common_sampler): penalties -> DRY -> top-n-sigma -> top-k ->
// typical -> top-p -> min-p -> XTC -> temperature -> draw from the softmax; or, with mirostat,
// penalties -> DRY -> temperature -> mirostat. temp <= 0 is greedy: the argmax of what the chain
// keeps (penalties, DRY and XTC can move it). See docs/sampling.md for each step and the
// saved-state format.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace vkllm {

class Tokenizer;
struct DryBreakers;

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
  float typical_p = 1.0f;         // >= 1: off; locally typical sampling's mass
  float top_n_sigma = -1.0f;      // <= 0: off; keeps logits within n standard deviations of the best
  float xtc_probability = 0.0f;   // 0: off; the chance a step excludes its top choices
  float xtc_threshold = 0.1f;     // > 0.5: off; the probability a top choice must reach to go
  float dry_multiplier = 0.0f;    // 0: off; DRY's penalty is multiplier * base^(length - allowed)
  float dry_base = 1.75f;
  int32_t dry_allowed_length = 2; // repeats up to this long go unpenalised
  int32_t dry_penalty_last_n = 64;  // tokens DRY looks back over (0: off)
  std::vector<std::string> dry_sequence_breakers = {"\n", ":", "\"", "*"};  // a repeat never spans one
  int32_t mirostat = 0;           // 0: off; 1 or 2 (replaces top-n-sigma … XTC and the draw)
  float mirostat_tau = 5.0f;      // target surprise (--mirostat-ent)
  float mirostat_eta = 0.1f;      // learning rate (--mirostat-lr)
  bool operator==(const SamplerParams&) const = default;
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

  // The vocabulary DRY finds its sequence breakers in. A Generator binds its sampler; the
  // tokenizer must outlive the sampler's use of it. An unbound sampler refuses to sample with DRY on.
  void bind(const Tokenizer& tok);
  // DRY's breakers as found in the bound vocabulary for these params' dry_sequence_breakers (a
  // server finds them once for the requests that share a list); made at the first DRY step if
  // not given.
  void share_dry_breakers(std::shared_ptr<const DryBreakers> b) { breakers_ = std::move(b); }

  // Chooses the next token from logits [n_vocab] f32 (the span is modified in place: the
  // penalties and DRY are applied to it). Greedy draws no random number unless XTC is on.
  int32_t sample(std::span<float> logits);

  // The candidates the draw would choose from, with their probabilities (sum 1), in chain order:
  // sorted by logit descending (ties: lower id first) when a step sorted them, else by id.
  // Greedy gives the argmax alone. Applies the penalties and DRY to `logits`; touches no RNG, so
  // it leaves out XTC's random cut and mirostat's.
  std::vector<Candidate> candidates(std::span<float> logits) const;

  void accept(int32_t token);  // record a token (prompt or generated) for the penalties and DRY; < 0 ignored
  void reset();                // forget the history (RNG and mirostat's state untouched)
  // The token history, oldest first, and a way back to one (a chat's /regen and /undo rewind
  // it to where the turn began); set_history keeps the last of `tokens` the penalties and DRY see.
  std::vector<int32_t> history() const { return {history_.begin(), history_.end()}; }
  void set_history(std::span<const int32_t> tokens);

  // Serialised state for session files: params, the token history, mirostat's state and the full RNG state, so
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
  float mirostat_mu() const { return mu_; }

 private:
  void apply_penalties(std::span<float> logits) const;
  bool penalties_on() const;
  bool dry_on() const;
  void apply_dry(std::span<float> logits) const;
  // The chain's steps from top-n-sigma to min-p over every token's (penalised) logit.
  std::vector<Candidate> filter(std::span<const float> logits) const;
  void xtc(std::vector<Candidate>& c);
  int32_t mirostat_sample(std::span<const float> logits);

  void seed_rng(uint64_t seed);
  // The most tokens the history keeps: the longer of the penalties' and DRY's windows.
  uint64_t history_capacity() const;
  // Drops the oldest history past its capacity and counts the penalty window again.
  void trim_history();

  SamplerParams params_;
  uint64_t seed_ = 0;
  std::mt19937 rng_;
  float mu_ = 0.0f;                                 // mirostat's maximum surprise, 2·tau at the start
  std::deque<int32_t> history_;                     // the last accepted tokens (history_capacity())
  std::unordered_map<int32_t, int32_t> counts_;     // token -> occurrences in the last repeat_last_n of history_
  const Tokenizer* vocab_ = nullptr;
  mutable std::shared_ptr<const DryBreakers> breakers_;  // made from vocab_ at the first DRY step
};

}  // namespace vkllm
