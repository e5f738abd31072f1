// Sampler: llama.cpp's chain (penalties -> DRY -> top-n-sigma -> top-k -> typical -> top-p -> min-p
// -> XTC -> temperature -> dist, or mirostat) and its state blob.
#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <xxhash.h>

#include "base/error.h"
#include "engine/dry.h"

namespace vkllm {
namespace {

constexpr char kStateMagic[4] = {'V', 'K', 'S', 'S'};
// 1: the chain before DRY, typical, top-n-sigma, XTC and mirostat (read as those off).
constexpr uint32_t kStateVersion = 2;
constexpr uint32_t kMaxBreakers = 64, kMaxBreakerText = 4096;
constexpr float kMaxMirostat = 1e6f;  // the largest tau and eta; mu stays within ±kMaxMu
constexpr float kMaxMu = 1e9f;
constexpr size_t kMaxRngText = 16384;  // mt19937's text form is ~7 KB (625 decimal words)

static_assert(std::endian::native == std::endian::little, "the state blob is written little-endian");

void check_param(bool ok, const char* name, double value, const char* allowed) {
  if (!ok) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%g", value);  // -2, 0.5, nan (not -2.000000)
    throw Error("sampler: " + std::string(name) + " = " + shown + " is out of range (" + allowed + ")");
  }
}

void validate_params(const SamplerParams& p) {
  check_param(std::isfinite(p.temp), "temp", p.temp, "a finite number");
  // top_p and min_p are probabilities (the server's range too): past 1 or below 0 they only
  // disguise other settings (top_p 1.5 is off, min_p 2 and top_p −0.1 are greedy).
  check_param(p.top_p >= 0.0f && p.top_p <= 1.0f, "top_p", p.top_p, "0 to 1");
  check_param(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p", p.min_p, "0 to 1");
  check_param(std::isfinite(p.repeat_penalty) && p.repeat_penalty > 0.0f, "repeat_penalty", p.repeat_penalty,
              "a finite number > 0");
  check_param(std::isfinite(p.frequency_penalty), "frequency_penalty", p.frequency_penalty, "a finite number");
  check_param(std::isfinite(p.presence_penalty), "presence_penalty", p.presence_penalty, "a finite number");
  check_param(p.repeat_last_n >= -1, "repeat_last_n", p.repeat_last_n, "-1, 0 or a window length");
  check_param(p.typical_p >= 0.0f && p.typical_p <= 1.0f, "typical_p (--typical)", p.typical_p, "0 to 1");
  check_param(std::isfinite(p.top_n_sigma), "top_n_sigma (--top-nsigma)", p.top_n_sigma, "a finite number");
  check_param(p.xtc_probability >= 0.0f && p.xtc_probability <= 1.0f, "xtc_probability", p.xtc_probability, "0 to 1");
  check_param(p.xtc_threshold >= 0.0f && p.xtc_threshold <= 1.0f, "xtc_threshold", p.xtc_threshold, "0 to 1");
  check_param(std::isfinite(p.dry_multiplier) && p.dry_multiplier >= 0.0f, "dry_multiplier", p.dry_multiplier, "a finite number >= 0");
  check_param(std::isfinite(p.dry_base) && p.dry_base >= 1.0f, "dry_base", p.dry_base, "a finite number >= 1");
  check_param(p.dry_allowed_length >= 0, "dry_allowed_length", p.dry_allowed_length, "0 or more");
  check_param(p.dry_penalty_last_n >= 0, "dry_penalty_last_n", p.dry_penalty_last_n, "0 or a window length");
  if (p.dry_sequence_breakers.size() > kMaxBreakers)
    throw Error("sampler: " + std::to_string(p.dry_sequence_breakers.size()) + " DRY sequence breakers (at most " +
                std::to_string(kMaxBreakers) + ")");
  for (const std::string& b : p.dry_sequence_breakers)
    if (b.size() > kMaxBreakerText)
      throw Error("sampler: a DRY sequence breaker of " + std::to_string(b.size()) + " bytes (at most " + std::to_string(kMaxBreakerText) + ")");
  check_param(p.mirostat >= 0 && p.mirostat <= 2, "mirostat", p.mirostat, "0: off, 1 or 2");
  // (Surprise is in bits: past a few dozen a target means nothing; the bounds keep mu finite.)
  check_param(p.mirostat_tau >= 0.0f && p.mirostat_tau <= kMaxMirostat, "mirostat_tau (--mirostat-ent)", p.mirostat_tau, "0 to 1e6");
  check_param(p.mirostat_eta >= 0.0f && p.mirostat_eta <= kMaxMirostat, "mirostat_eta (--mirostat-lr)", p.mirostat_eta, "0 to 1e6");
}

// A window of -1 tokens: unbounded.
uint64_t window_of(int32_t n) { return n < 0 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(n); }

// DRY's window (0 while DRY is off).
uint64_t dry_window(const SamplerParams& p) { return p.dry_multiplier == 0.0f ? 0 : uint64_t(p.dry_penalty_last_n); }

// The most tokens the history holds: the longer of the penalties' window (kept while they are
// off, so that flags turning them on find it) and DRY's.
uint64_t params_max_history(const SamplerParams& p) { return std::max(window_of(p.repeat_last_n), dry_window(p)); }

// Higher logit first; equal logits by lower id, so the order never depends on the sort algorithm.
bool by_logit_desc(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Softmax over the candidates' logits into p. An all -inf (or +inf) maximum gives equal weight
// to the candidates that reach it instead of NaN.
void softmax(std::vector<Candidate>& c) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (const Candidate& x : c) max_logit = std::max(max_logit, x.logit);
  double sum = 0.0;
  for (Candidate& x : c) {
    x.p = x.logit == max_logit ? 1.0f : std::exp(x.logit - max_logit);
    sum += x.p;
  }
  for (Candidate& x : c) x.p = static_cast<float>(x.p / sum);
}

// A uniform double in [0, 1) from two 32-bit engine outputs (53 random bits). Written out rather
// than std::uniform_real_distribution so the draw is the same under every standard library.
double draw_unit(std::mt19937& rng) {
  const uint64_t a = static_cast<uint32_t>(rng()) >> 5;  // 27 bits
  const uint64_t b = static_cast<uint32_t>(rng()) >> 6;  // 26 bits
  return static_cast<double>((a << 26) | b) * 0x1.0p-53;
}

std::string rng_text(const std::mt19937& rng) {
  std::ostringstream os;
  os << rng;
  return os.str();
}

// Little-endian byte writer and a bounds-checked reader for the state blob.
class BlobWriter {
 public:
  template <typename T>
  void put(T v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
  }
  void put_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class BlobReader {
 public:
  explicit BlobReader(std::span<const uint8_t> b) : b_(b) {}
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::span<const uint8_t> get_bytes(size_t n, const char* what) {
    need(n, what);
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error("sampler state: offset " + std::to_string(pos_) + ": " + msg);
  }

 private:
  void need(size_t n, const char* what) const {
    if (n > left()) {
      fail(std::string("truncated: ") + what + " needs " + std::to_string(n) + " bytes, " +
           std::to_string(left()) + " left");
    }
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace

void Sampler::validate(const SamplerParams& p) { validate_params(p); }

Sampler::Sampler(const SamplerParams& p) : params_(p) {
  validate_params(p);
  seed_rng(p.seed);
  mu_ = 2.0f * p.mirostat_tau;
}

void Sampler::bind(const Tokenizer& tok) {
  if (vocab_ != &tok) breakers_.reset();
  vocab_ = &tok;
}

void Sampler::seed_rng(uint64_t seed) {
  seed_ = seed;
  if (seed_ == kRandomSeed) {
    std::random_device rd;
    do seed_ = rd(); while (seed_ == kRandomSeed);
  }
  // A 32-bit seed seeds mt19937 directly (as llama.cpp does); wider seeds go through seed_seq.
  if (seed_ <= 0xFFFFFFFFu) {
    rng_.seed(static_cast<uint32_t>(seed_));
  } else {
    std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
    rng_.seed(seq);
  }
}

void Sampler::set_params(const SamplerParams& p, bool reseed) {
  validate_params(p);
  if (p.dry_sequence_breakers != params_.dry_sequence_breakers) breakers_.reset();
  if (p.mirostat != params_.mirostat || p.mirostat_tau != params_.mirostat_tau) mu_ = 2.0f * p.mirostat_tau;
  params_ = p;
  if (reseed) seed_rng(p.seed);
  trim_history();
}

uint64_t Sampler::history_capacity() const { return params_max_history(params_); }

void Sampler::trim_history() {
  const uint64_t cap = history_capacity();
  while (history_.size() > cap) history_.pop_front();
  // The penalties count the last repeat_last_n tokens.
  counts_.clear();
  const size_t n = size_t(std::min<uint64_t>(history_.size(), window_of(params_.repeat_last_n)));
  for (size_t i = history_.size() - n; i < history_.size(); ++i) ++counts_[history_[i]];
}

bool Sampler::penalties_on() const {
  return params_.repeat_last_n != 0 &&
         (params_.repeat_penalty != 1.0f || params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f);
}

bool Sampler::dry_on() const {
  return params_.dry_multiplier != 0.0f && params_.dry_penalty_last_n != 0 && params_.dry_base >= 1.0f;
}

void Sampler::apply_dry(std::span<float> logits) const {
  if (!dry_on()) return;
  if (!vocab_) throw Error("sampler: DRY needs the model's vocabulary (an unbound sampler)");
  if (!breakers_) breakers_ = std::make_shared<const DryBreakers>(dry_breakers(*vocab_, params_.dry_sequence_breakers));
  dry_penalize(logits, history_, *breakers_,
               DryParams{params_.dry_multiplier, params_.dry_base, params_.dry_allowed_length, dry_window(params_)});
}

void Sampler::apply_penalties(std::span<float> logits) const {
  if (!penalties_on()) return;
  for (const auto& [token, count] : counts_) {
    if (static_cast<size_t>(token) >= logits.size()) continue;  // a token outside this vocabulary
    float& l = logits[static_cast<size_t>(token)];
    l = l > 0.0f ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    l -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
  }
}

namespace {

// The index of the highest logit (first on ties); NaN never wins unless every logit is NaN.
size_t argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i]))) best = i;
  return best;
}

// Every token as a candidate; NaN logits become -inf (they must not break the sorts' ordering).
std::vector<Candidate> all_candidates(std::span<const float> logits) {
  std::vector<Candidate> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
    c[i] = Candidate{static_cast<int32_t>(i), l, 0.0f};
  }
  return c;
}

// top-n-sigma: keeps the logits within n standard deviations of the best, the mean and deviation
// over the finite ones (llama.cpp's; on the whole vocabulary, before top-k).
void top_n_sigma(std::vector<Candidate>& c, float n) {
  double sum = 0.0, count = 0.0;
  float best = -std::numeric_limits<float>::infinity();
  for (const Candidate& x : c)
    if (std::isfinite(x.logit)) sum += x.logit, count += 1.0, best = std::max(best, x.logit);
  if (count == 0.0) return;
  const double mean = sum / count;
  double acc = 0.0;
  for (const Candidate& x : c)
    if (std::isfinite(x.logit)) acc += (x.logit - mean) * (x.logit - mean);
  const float floor = best - n * float(std::sqrt(acc / count));
  std::erase_if(c, [&](const Candidate& x) { return !(x.logit >= floor); });
}

// Locally typical sampling: keeps the candidates whose surprise (−log p) is nearest the entropy,
// nearest first, until their mass passes typical_p; then back in logit order (c sorted by logit).
void typical(std::vector<Candidate>& c, float mass) {
  softmax(c);
  double entropy = 0.0;
  for (const Candidate& x : c)
    if (x.p > 0.0f) entropy -= double(x.p) * std::log(double(x.p));
  std::vector<std::pair<double, size_t>> order(c.size());
  for (size_t i = 0; i < c.size(); ++i) order[i] = {std::fabs(-std::log(double(c[i].p)) - entropy), i};
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double cum = 0.0;
  size_t keep = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    cum += c[order[i].second].p;
    if (cum > mass) {
      keep = i + 1;
      break;
    }
  }
  std::vector<bool> kept(c.size(), false);
  for (size_t i = 0; i < keep; ++i) kept[order[i].second] = true;
  std::vector<Candidate> out;
  out.reserve(keep);
  for (size_t i = 0; i < c.size(); ++i)
    if (kept[i]) out.push_back(c[i]);
  c = std::move(out);
}

}  // namespace

std::vector<Candidate> Sampler::filter(std::span<const float> logits) const {
  std::vector<Candidate> c = all_candidates(logits);
  bool sorted = false;

  if (params_.top_n_sigma > 0.0f && c.size() > 1) top_n_sigma(c, params_.top_n_sigma);

  // top-k: partial sort, O(n log k) instead of a full sort of the vocabulary.
  if (params_.top_k > 0) {
    const size_t k = std::min(static_cast<size_t>(params_.top_k), c.size());
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(k), c.end(), by_logit_desc);
    c.resize(k);
    sorted = true;
  }

  if (params_.typical_p < 1.0f && c.size() > 1) {
    if (!sorted) std::sort(c.begin(), c.end(), by_logit_desc);
    typical(c, params_.typical_p);
    sorted = true;
  }

  // top-p: the smallest prefix (by probability) whose mass reaches top_p; at least one token.
  // Without top-k the vocabulary is unsorted: select and sort it in growing blocks (256, 512, ...)
  // and stop once the prefix reaches top_p, instead of sorting all 150k tokens.
  if (params_.top_p < 1.0f) {
    softmax(c);
    size_t n_sorted = sorted ? c.size() : 0;
    size_t block = 256;
    double cum = 0.0;
    size_t keep = 0;
    for (size_t i = 0; i < c.size() && keep == 0; ++i) {
      if (i == n_sorted) {
        const size_t end = std::min(c.size(), n_sorted + block);
        const auto first = c.begin() + static_cast<ptrdiff_t>(n_sorted);
        const auto last = c.begin() + static_cast<ptrdiff_t>(end);
        std::nth_element(first, last - 1, c.end(), by_logit_desc);  // O(n), then sort the block
        std::sort(first, last, by_logit_desc);
        n_sorted = end;
        block *= 2;
      }
      cum += c[i].p;
      if (cum >= params_.top_p) keep = i + 1;
    }
    c.resize(keep == 0 ? c.size() : keep);
    sorted = true;
  }

  // min-p: drop tokens with p < min_p * p_max, i.e. logit < max_logit + log(min_p).
  if (params_.min_p > 0.0f) {
    float max_logit = c.front().logit;
    if (!sorted) {
      for (const Candidate& x : c) max_logit = std::max(max_logit, x.logit);
    }
    // Capped at max_logit so the best token always survives (min_p > 1; llama.cpp keeps it too).
    const float min_logit = std::min(max_logit + std::log(params_.min_p), max_logit);
    const auto kept_end =
        std::remove_if(c.begin(), c.end(), [&](const Candidate& x) { return x.logit < min_logit; });
    c.erase(kept_end, c.end());
  }
  return c;
}

// XTC: with probability xtc_probability, drops every candidate whose probability reaches
// xtc_threshold but the least likely of them (nothing when fewer than two reach it).
void Sampler::xtc(std::vector<Candidate>& c) {
  if (params_.xtc_probability <= 0.0f || params_.xtc_threshold > 0.5f || c.size() < 2) return;
  if (draw_unit(rng_) > params_.xtc_probability) return;
  std::sort(c.begin(), c.end(), by_logit_desc);
  softmax(c);
  size_t last = 0;
  while (last + 1 < c.size() && c[last + 1].p >= params_.xtc_threshold) ++last;
  if (last > 0 && c[0].p >= params_.xtc_threshold) c.erase(c.begin(), c.begin() + static_cast<ptrdiff_t>(last));
}

std::vector<Candidate> Sampler::candidates(std::span<float> logits) const {
  VKLLM_CHECK(!logits.empty(), "sampler: empty logits");
  apply_penalties(logits);
  apply_dry(logits);
  if (params_.temp <= 0.0f) {
    const size_t best = argmax(logits);
    return {Candidate{static_cast<int32_t>(best), logits[best], 1.0f}};
  }
  std::vector<Candidate> c = params_.mirostat ? all_candidates(logits) : filter(logits);
  // temperature, then the distribution the draw uses.
  for (Candidate& x : c) x.logit /= params_.temp;
  softmax(c);
  return c;
}

// Mirostat (llama.cpp's v1 and v2) over every token, tempered: v1 keeps the top k, k from the
// Zipf exponent its 100 likeliest tokens suggest and the target surprise; v2 the tokens whose
// surprise (−log2 p) is at most mu. One draw, then mu moves by eta times the draw's surprise
// less tau.
int32_t Sampler::mirostat_sample(std::span<const float> logits) {
  std::vector<Candidate> c = all_candidates(logits);
  for (Candidate& x : c) x.logit /= params_.temp;
  std::sort(c.begin(), c.end(), by_logit_desc);
  softmax(c);
  if (params_.mirostat == 1) {
    const size_t m = 100;
    double sum_tb = 0.0, sum_tt = 0.0;
    for (size_t i = 0; i + 1 < m && i + 1 < c.size(); ++i) {
      const double t = std::log(double(i + 2) / double(i + 1));
      const double b = std::log(double(c[i].p) / double(c[i + 1].p));
      sum_tb += t * b;
      sum_tt += t * t;
    }
    const double s_hat = sum_tb / sum_tt, eps = s_hat - 1.0;
    const double k = std::pow(eps * std::pow(2.0, double(mu_)) / (1.0 - std::pow(double(c.size()), -eps)), 1.0 / s_hat);
    // (k is NaN or infinite where the estimate breaks down: every token then.)
    const size_t keep = std::isfinite(k) ? size_t(std::clamp(k, 1.0, double(c.size()))) : c.size();
    c.resize(keep);
  } else {
    size_t keep = 0;
    while (keep < c.size() && -std::log2(c[keep].p) <= mu_) ++keep;
    c.resize(std::max<size_t>(keep, 1));
  }
  softmax(c);
  const double u = draw_unit(rng_);
  double cum = 0.0;
  size_t pick = c.size() - 1;
  for (size_t i = 0; i < c.size(); ++i) {
    cum += c[i].p;
    if (cum > u) {
      pick = i;
      break;
    }
  }
  mu_ = std::clamp(mu_ - params_.mirostat_eta * (-std::log2(c[pick].p) - params_.mirostat_tau), -kMaxMu, kMaxMu);
  return c[pick].id;
}

int32_t Sampler::sample(std::span<float> logits) {
  VKLLM_CHECK(!logits.empty(), "sampler: empty logits");
  apply_penalties(logits);
  apply_dry(logits);
  const bool xtc_on = params_.xtc_probability > 0.0f && params_.xtc_threshold <= 0.5f && !params_.mirostat;
  if (params_.temp <= 0.0f && !xtc_on) return static_cast<int32_t>(argmax(logits));
  if (params_.mirostat) return mirostat_sample(logits);
  std::vector<Candidate> c = filter(logits);
  xtc(c);
  if (params_.temp <= 0.0f) return std::min_element(c.begin(), c.end(), by_logit_desc)->id;  // the best XTC left
  for (Candidate& x : c) x.logit /= params_.temp;
  softmax(c);
  // dist: a uniform u in [0, 1) over the cumulative probabilities; the first token past u.
  const double u = draw_unit(rng_);
  double cum = 0.0;
  for (const Candidate& x : c) {
    cum += x.p;
    if (cum > u) return x.id;
  }
  return c.back().id;  // rounding left the total just under u
}

void Sampler::accept(int32_t token) {
  if (token < 0 || history_capacity() == 0) return;
  history_.push_back(token);
  ++counts_[token];
  // The token that leaves the penalties' window.
  const uint64_t w = window_of(params_.repeat_last_n);
  if (history_.size() > w) {
    const int32_t old = history_[history_.size() - 1 - size_t(w)];
    if (--counts_[old] == 0) counts_.erase(old);
  }
  if (history_.size() > history_capacity()) history_.pop_front();
}

void Sampler::reset() {
  history_.clear();
  counts_.clear();
}

void Sampler::set_history(std::span<const int32_t> tokens) {
  reset();
  for (const int32_t t : tokens) accept(t);
}

std::vector<uint8_t> Sampler::save_state() const {
  BlobWriter w;
  w.put_bytes(kStateMagic, sizeof(kStateMagic));
  w.put<uint32_t>(kStateVersion);
  w.put<float>(params_.temp);
  w.put<int32_t>(params_.top_k);
  w.put<float>(params_.top_p);
  w.put<float>(params_.min_p);
  w.put<float>(params_.repeat_penalty);
  w.put<float>(params_.frequency_penalty);
  w.put<float>(params_.presence_penalty);
  w.put<int32_t>(params_.repeat_last_n);
  w.put<uint64_t>(params_.seed);
  w.put<uint64_t>(seed_);
  VKLLM_CHECK(history_.size() <= 0xFFFFFFFFu, "sampler: token history exceeds 2^32 tokens");
  w.put<uint32_t>(static_cast<uint32_t>(history_.size()));
  for (int32_t t : history_) w.put<int32_t>(t);
  const std::string text = rng_text(rng_);
  VKLLM_CHECK(text.size() <= kMaxRngText, "sampler: mt19937 text state is unexpectedly long");
  w.put<uint32_t>(static_cast<uint32_t>(text.size()));
  w.put_bytes(text.data(), text.size());
  // Version 2 (after version 1's fields, which keep their offsets): the steps added to the chain,
  // and mirostat's state.
  w.put<float>(params_.typical_p);
  w.put<float>(params_.top_n_sigma);
  w.put<float>(params_.xtc_probability);
  w.put<float>(params_.xtc_threshold);
  w.put<float>(params_.dry_multiplier);
  w.put<float>(params_.dry_base);
  w.put<int32_t>(params_.dry_allowed_length);
  w.put<int32_t>(params_.dry_penalty_last_n);
  w.put<uint32_t>(static_cast<uint32_t>(params_.dry_sequence_breakers.size()));
  for (const std::string& b : params_.dry_sequence_breakers) {
    w.put<uint32_t>(static_cast<uint32_t>(b.size()));
    w.put_bytes(b.data(), b.size());
  }
  w.put<int32_t>(params_.mirostat);
  w.put<float>(params_.mirostat_tau);
  w.put<float>(params_.mirostat_eta);
  w.put<float>(mu_);
  const uint64_t hash = XXH64(w.bytes().data(), w.bytes().size(), 0);
  w.put<uint64_t>(hash);
  return std::move(w.bytes());
}

void Sampler::restore_state(std::span<const uint8_t> blob) {
  BlobReader r(blob);
  // Checksum first: any truncation or flipped byte fails here with one clear message.
  if (blob.size() < sizeof(uint64_t)) r.fail("truncated: " + std::to_string(blob.size()) + " bytes");
  uint64_t stored_hash;
  std::memcpy(&stored_hash, blob.data() + blob.size() - sizeof(uint64_t), sizeof(uint64_t));
  const auto body = blob.first(blob.size() - sizeof(uint64_t));
  if (XXH64(body.data(), body.size(), 0) != stored_hash) {
    throw Error("sampler state: checksum mismatch (" + std::to_string(blob.size()) +
                " bytes): truncated or corrupted");
  }
  // The fields are still validated one by one: a hostile blob can carry a valid checksum.
  r = BlobReader(body);
  const auto magic = r.get_bytes(sizeof(kStateMagic), "magic");
  if (std::memcmp(magic.data(), kStateMagic, sizeof(kStateMagic)) != 0) r.fail("bad magic (expected 'VKSS')");
  const auto version = r.get<uint32_t>("version");
  if (version != 1 && version != kStateVersion) {
    r.fail("version " + std::to_string(version) + " is not supported (expected 1 or " + std::to_string(kStateVersion) + ")");
  }
  SamplerParams p;
  p.temp = r.get<float>("temp");
  p.top_k = r.get<int32_t>("top_k");
  p.top_p = r.get<float>("top_p");
  p.min_p = r.get<float>("min_p");
  p.repeat_penalty = r.get<float>("repeat_penalty");
  p.frequency_penalty = r.get<float>("frequency_penalty");
  p.presence_penalty = r.get<float>("presence_penalty");
  p.repeat_last_n = r.get<int32_t>("repeat_last_n");
  p.seed = r.get<uint64_t>("seed");
  // Files from before top_p and min_p were held to 0 … 1: the nearest end samples the same way
  // (top_p past 1 is off, below 0 keeps the best token; min_p past 1 keeps the best token).
  if (std::isfinite(p.top_p)) p.top_p = std::clamp(p.top_p, 0.0f, 1.0f);
  if (std::isfinite(p.min_p)) p.min_p = std::clamp(p.min_p, 0.0f, 1.0f);
  const auto seed_used = r.get<uint64_t>("seed used");

  const auto n_history = r.get<uint32_t>("history length");
  if (static_cast<uint64_t>(n_history) * sizeof(int32_t) > r.left()) {
    r.fail("history length " + std::to_string(n_history) + " needs more bytes than the " + std::to_string(r.left()) +
           " left");
  }
  std::deque<int32_t> history;
  for (uint32_t i = 0; i < n_history; ++i) {
    const auto t = r.get<int32_t>("history token");
    if (t < 0) r.fail("history token " + std::to_string(i) + " = " + std::to_string(t) + " is negative");
    history.push_back(t);
  }

  const auto text_len = r.get<uint32_t>("rng state length");
  if (text_len > kMaxRngText) {
    r.fail("rng state length " + std::to_string(text_len) + " exceeds " + std::to_string(kMaxRngText));
  }
  const auto text_bytes = r.get_bytes(text_len, "rng state");
  const std::string text(text_bytes.begin(), text_bytes.end());
  if (text.find_first_not_of("0123456789 ") != std::string::npos) r.fail("rng state holds a non-digit byte");
  // Every word must fit 32 bits: libstdc++ keeps the words in 64-bit slots and would accept more,
  // giving outputs above mt19937::max().
  for (size_t at = text.find_first_not_of(' '); at != std::string::npos; at = text.find_first_not_of(' ', at)) {
    const size_t end = std::min(text.find(' ', at), text.size());
    if (end - at > 10 || std::stoull(text.substr(at, end - at)) > 0xFFFFFFFFull) {
      r.fail("rng state word '" + text.substr(at, std::min<size_t>(end - at, 20)) + "' exceeds 32 bits");
    }
    at = end;
  }
  std::istringstream is(text);
  std::mt19937 rng;
  is >> rng;
  if (is.fail()) r.fail("rng state does not parse as std::mt19937");
  is >> std::ws;
  if (!is.eof()) r.fail("rng state has trailing data");
  float mu = 2.0f * p.mirostat_tau;
  if (version >= 2) {
    p.typical_p = r.get<float>("typical_p");
    p.top_n_sigma = r.get<float>("top_n_sigma");
    p.xtc_probability = r.get<float>("xtc_probability");
    p.xtc_threshold = r.get<float>("xtc_threshold");
    p.dry_multiplier = r.get<float>("dry_multiplier");
    p.dry_base = r.get<float>("dry_base");
    p.dry_allowed_length = r.get<int32_t>("dry_allowed_length");
    p.dry_penalty_last_n = r.get<int32_t>("dry_penalty_last_n");
    const auto n_breakers = r.get<uint32_t>("DRY sequence breaker count");
    if (n_breakers > kMaxBreakers) r.fail(std::to_string(n_breakers) + " DRY sequence breakers (at most " + std::to_string(kMaxBreakers) + ")");
    p.dry_sequence_breakers.clear();
    for (uint32_t i = 0; i < n_breakers; ++i) {
      const auto len = r.get<uint32_t>("DRY sequence breaker length");
      if (len > kMaxBreakerText) r.fail("DRY sequence breaker of " + std::to_string(len) + " bytes (at most " + std::to_string(kMaxBreakerText) + ")");
      const auto bytes = r.get_bytes(len, "DRY sequence breaker");
      p.dry_sequence_breakers.emplace_back(bytes.begin(), bytes.end());
    }
    p.mirostat = r.get<int32_t>("mirostat");
    p.mirostat_tau = r.get<float>("mirostat_tau");
    p.mirostat_eta = r.get<float>("mirostat_eta");
    mu = r.get<float>("mirostat mu");
    if (!(std::fabs(mu) <= kMaxMu)) r.fail("mirostat mu is not a number within ±1e9");
  } else {
    p.dry_multiplier = 0.0f;  // version 1: the steps added since, off
  }
  validate_params(p);
  if (params_max_history(p) < n_history) {
    r.fail("history length " + std::to_string(n_history) + " exceeds the windows of the penalties (" + std::to_string(p.repeat_last_n) +
           ") and DRY (" + std::to_string(p.dry_multiplier == 0.0f ? 0 : p.dry_penalty_last_n) + ")");
  }
  if (r.left() != 0) r.fail(std::to_string(r.left()) + " unexpected trailing bytes");

  if (p.dry_sequence_breakers != params_.dry_sequence_breakers) breakers_.reset();
  params_ = p;
  seed_ = seed_used;
  rng_ = rng;
  mu_ = mu;
  history_ = std::move(history);
  trim_history();  // (counts the penalties' window)
}

}  // namespace vkllm
