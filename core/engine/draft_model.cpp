// The draft model's proposals and the vocabulary check.
#include "engine/draft_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/generate.h"

namespace vkllm {

std::string draft_vocab_mismatch(const Tokenizer& target, const Tokenizer& draft) {
  if (target.model() != draft.model())
    return "its tokenizer is " + draft.model() + ", the model's " + target.model();
  const auto differ = [](const char* what, int32_t t, int32_t d) {
    return std::string(what) + " " + std::to_string(d) + ", the model's " + std::to_string(t);
  };
  if (target.bos() != draft.bos()) return differ("its BOS token is", target.bos(), draft.bos());
  if (target.eos() != draft.eos()) return differ("its EOS token is", target.eos(), draft.eos());
  if (target.add_bos() != draft.add_bos() || target.add_eos() != draft.add_eos())
    return "it adds BOS/EOS to a prompt differently from the model";
  const int32_t nt = target.n_vocab(), nd = draft.n_vocab();
  constexpr int32_t k_max_difference = 128;  // llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
  if (std::abs(nt - nd) > k_max_difference)
    return "its vocabulary has " + std::to_string(nd) + " tokens, the model's " + std::to_string(nt) + " (at most " +
           std::to_string(k_max_difference) + " apart)";
  for (int32_t id = 5; id < std::min(nt, nd); ++id)
    if (target.token_text(id) != draft.token_text(id))
      return "token " + std::to_string(id) + " is '" + draft.token_text(id) + "', the model's '" + target.token_text(id) + "'";
  return "";
}

bool drafts_with_model(const SpeculativeOptions& s, const Engine& engine) {
  const KvCache& cache = engine.cache();
  return s.type == SpecType::DraftModel && engine.verify_exact() && cache.used() + 1 < cache.capacity();
}

DraftModel::DraftModel(Engine& engine, int32_t target_vocab, int32_t unknown, double prior_ratio)
    : engine_(engine),
      target_vocab_(target_vocab),
      draft_vocab_(int32_t(engine.config().n_vocab)),
      unknown_(unknown >= 0 && unknown < int32_t(engine.config().n_vocab) ? unknown : 0),
      prior_ratio_(prior_ratio) {}

std::span<const int32_t> DraftModel::in_vocab(std::span<const int32_t> context) {
  if (std::all_of(context.begin(), context.end(), [&](int32_t t) { return t < draft_vocab_; })) return context;
  // (A guess from a context with a token the draft cannot read is still only a guess: the model
  // verifies it.)
  mapped_.assign(context.begin(), context.end());
  for (int32_t& t : mapped_)
    if (t >= draft_vocab_) t = unknown_;
  return mapped_;
}

std::vector<int32_t> DraftModel::propose(std::span<const int32_t> context, uint32_t max, float p_min) {
  std::vector<int32_t> draft;
  if (context.empty() || max == 0) return draft;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &sync(context, {});
  uint32_t passes = 1;
  for (;;) {
    // The most likely token (the lowest id among equals) and its probability under the softmax.
    const std::vector<float>& l = *logits;
    const size_t best = size_t(std::max_element(l.begin(), l.end()) - l.begin());
    double sum = 0.0;
    for (float v : l) sum += std::exp(double(v) - l[best]);
    if (1.0 / sum < p_min || int64_t(best) >= target_vocab_) break;
    draft.push_back(int32_t(best));
    if (draft.size() >= max) break;
    const int32_t tok = draft.back();
    logits = &engine_.decode(std::span(&tok, 1), LogitsMode::Last);
    ++passes;
  }
  // A decaying sum, so the cost follows the context's growth and the device's pace.
  constexpr double k_decay = 0.8;
  ms_ = ms_ * k_decay + std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  passes_ = passes_ * k_decay + passes;
  return draft;
}

const std::vector<float>& DraftModel::sync(std::span<const int32_t> original, const ProgressFn& progress) {
  const std::span<const int32_t> context = in_vocab(original);
  KvCache& cache = engine_.cache();
  // Keep the longest prefix of the context the draft's cache holds (less the context's last token,
  // whose logits are needed); the rest runs as a prompt. A cache whose ring evicted holds no prefix.
  const uint32_t keep = reusable_prefix(cache, context);
  cache.truncate(keep);
  return engine_.decode(context.subspan(keep), LogitsMode::Last, progress);
}

void DraftModel::catch_up(std::span<const int32_t> context, const ProgressFn& progress) {
  if (!context.empty()) sync(context, progress);
}

bool DraftModel::catch_up_step(std::span<const int32_t> original, uint32_t max_tokens) {
  if (original.size() < 2) return false;
  const std::span<const int32_t> context = in_vocab(original);
  // What the cache holds of the context, as a proposal's sync keeps it: at most all but its last token.
  KvCache& cache = engine_.cache();
  const uint32_t keep = reusable_prefix(cache, context), held = uint32_t(context.size()) - 1;
  cache.truncate(keep);
  if (keep >= held) return false;
  const uint32_t n = std::min(std::max<uint32_t>(max_tokens, 1), held - keep);
  engine_.decode(context.subspan(keep, n), LogitsMode::Last);
  return keep + n < held;
}

double DraftModel::cost_ratio(double target_step_ms) const {
  if (!(target_step_ms > 0)) return prior_ratio_;
  return (ms_ + prior_ratio_ * target_step_ms) / (passes_ + 1.0) / target_step_ms;
}

void DraftModel::fade() {
  ms_ *= 0.98;
  passes_ *= 0.98;
}

}  // namespace vkllm
