// Perplexity in the two modes; the log-softmax runs on the device (LogitsMode::AllLogProbs).
#include "engine/perplexity.h"

#include <cmath>

namespace vkllm {

void check_perplexity_text(uint64_t n_tokens, uint32_t ctx, bool stream) {
  const std::string has = "the text has " + std::to_string(n_tokens) + (n_tokens == 1 ? " token" : " tokens");
  if (stream) {
    if (n_tokens < 2) throw Error(has + ", fewer than 2");
    return;
  }
  if (ctx < 4) throw Error("--ctx " + std::to_string(ctx) + " is too small for perplexity (at least 4)");
  if (n_tokens < ctx)
    throw Error(has + ", fewer than one chunk of --ctx " + std::to_string(ctx) + " (a smaller --ctx, or --stream, scores it)");
}

PerplexityResult perplexity_chunked(Engine& engine, std::span<const int32_t> tokens, uint32_t ctx, int32_t bos,
                                    const PerplexityProgress& progress) {
  check_perplexity_text(tokens.size(), ctx, false);
  if (engine.cache().capacity() < ctx) throw Error("the cache holds fewer tokens than --ctx");
  const uint32_t n_chunks = static_cast<uint32_t>(tokens.size() / ctx);
  const uint32_t n_vocab = engine.config().n_vocab;
  PerplexityResult r;
  r.chunks = n_chunks;
  std::vector<int32_t> chunk(ctx);
  for (uint32_t c = 0; c < n_chunks; ++c) {
    std::copy(tokens.begin() + uint64_t{c} * ctx, tokens.begin() + uint64_t{c + 1} * ctx, chunk.begin());
    if (bos >= 0) chunk[0] = bos;
    engine.cache().clear();
    const std::vector<float>& lp = engine.decode(chunk, LogitsMode::AllLogProbs);
    for (uint32_t j = ctx / 2; j + 1 < ctx; ++j) {
      r.nll_sum -= lp[uint64_t{j} * n_vocab + uint32_t(chunk[j + 1])];
      ++r.tokens_scored;
    }
    if (progress) progress(c + 1, n_chunks, std::exp(r.mean_nll()));
  }
  r.perplexity = std::exp(r.mean_nll());
  return r;
}

PerplexityResult perplexity_stream(Engine& engine, std::span<const int32_t> tokens, uint32_t keep, const PerplexityProgress& progress) {
  check_perplexity_text(tokens.size(), 0, true);
  KvCache& cache = engine.cache();
  cache.clear();
  cache.set_keep(std::min(keep, cache.max_keep()));
  PerplexityResult r;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const std::vector<float>& lp = engine.decode(tokens.subspan(i, 1), LogitsMode::AllLogProbs);
    r.nll_sum -= lp[uint32_t(tokens[i + 1])];
    ++r.tokens_scored;
    if (progress && (i % 64 == 0 || i + 2 == tokens.size()))
      progress(i + 1, tokens.size() - 1, std::exp(r.mean_nll()));
  }
  r.perplexity = std::exp(r.mean_nll());
  return r;
}

}  // namespace vkllm
