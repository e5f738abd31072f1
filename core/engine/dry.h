// DRY ("don't repeat yourself", llama.cpp's dry sampler): a penalty on the token that would extend
// a stretch of the context that repeats an earlier one, growing exponentially with its length.
// docs/sampling.md, "DRY".
#pragma once
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace vkllm {

class Tokenizer;

// The sequence breakers as token sequences: for a head token, the tokens that must follow it to
// complete a breaker (none: the token's own text holds one). A repeat never reaches back past one.
struct DryBreakers {
  std::unordered_multimap<int32_t, std::vector<int32_t>> tails;
};

// The breakers in `tok`'s vocabulary, as llama.cpp finds them: every token whose text holds a
// breaker (a single-token breaker), and every token whose text ends with the start of one, with
// the rest of the breaker tokenized as its tail (at most 20 tokens). A breaker is cut to 40 bytes;
// empty ones are skipped.
DryBreakers dry_breakers(const Tokenizer& tok, std::span<const std::string> breakers);

struct DryParams {
  float multiplier;
  float base;
  int32_t allowed_length;
  uint64_t window;  // tokens of the history looked at
};

// Subtracts DRY's penalty from `logits` for every token that would extend a repeat of at least
// allowed_length tokens of `history` (oldest first), by multiplier * base^(length - allowed_length)
// for the longest such repeat; a single-token breaker is never penalised.
void dry_penalize(std::span<float> logits, const std::deque<int32_t>& history, const DryBreakers& breakers, const DryParams& p);

}  // namespace vkllm
