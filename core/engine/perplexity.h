// Perplexity: chunked exactly as llama.cpp's llama-perplexity, or streamed token by token through
// the ring-buffered cache (the test of the ring past its capacity).
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "engine/engine.h"

namespace vkllm {

struct PerplexityResult {
  double perplexity = 0;
  uint64_t tokens_scored = 0;
  uint32_t chunks = 0;   // chunked mode
  double nll_sum = 0;    // Σ −log p(token)
  double mean_nll() const { return tokens_scored ? nll_sum / double(tokens_scored) : 0.0; }  // perplexity = e^this
};

// Progress of a scoring run: units done of total (chunks, or tokens streamed) and the estimate so
// far (exp of the mean −log p of the tokens scored up to now), as llama-perplexity prints per chunk.
using PerplexityProgress = std::function<void(uint64_t done, uint64_t total, double running_perplexity)>;

// Throws (one line, naming the count) where a text of n_tokens cannot be scored: fewer than one
// chunk of ctx tokens (chunked, ctx ≥ 4), or fewer than 2 tokens (streamed). The modes call it;
// a caller may call it first, before it loads the weights.
void check_perplexity_text(uint64_t n_tokens, uint32_t ctx, bool stream);

// llama-perplexity: `tokens` (BOS first) cut into chunks of ctx tokens (the remainder dropped),
// each starting with BOS from an empty cache; the tokens of the second half of each chunk are
// scored (positions ctx/2 … ctx−2 predicting the next). The engine's cache must hold ctx tokens.
// `progress` gets chunks done / total after each chunk.
PerplexityResult perplexity_chunked(Engine& engine, std::span<const int32_t> tokens, uint32_t ctx, int32_t bos,
                                    const PerplexityProgress& progress = {});

// Every token after the first, fed one at a time through the ring (pinned `keep` tokens,
// evicting the oldest window token when full) and scored before it is fed.
PerplexityResult perplexity_stream(Engine& engine, std::span<const int32_t> tokens, uint32_t keep,
                                   const PerplexityProgress& progress = {});

}  // namespace vkllm
