// Sampler: the penalties -> top-k -> top-p -> min-p -> temperature -> dist chain and its state blob.
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

namespace vkllm {
namespace {

constexpr char kStateMagic[4] = {'V', 'K', 'S', 'S'};
constexpr uint32_t kStateVersion = 1;
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
}

// The most tokens the penalty window holds under these params.
uint64_t params_max_history(const SamplerParams& p) {
  return p.repeat_last_n < 0 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(p.repeat_last_n);
}

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
  params_ = p;
  if (reseed) seed_rng(p.seed);
  trim_history();
}

void Sampler::trim_history() {
  if (params_.repeat_last_n == 0) reset();
  while (params_.repeat_last_n > 0 && history_.size() > static_cast<size_t>(params_.repeat_last_n)) {
    const int32_t old = history_.front();
    history_.pop_front();
    if (--counts_[old] == 0) counts_.erase(old);
  }
}

bool Sampler::penalties_on() const {
  return params_.repeat_last_n != 0 &&
         (params_.repeat_penalty != 1.0f || params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f);
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

std::vector<Candidate> Sampler::candidates(std::span<float> logits) const {
  VKLLM_CHECK(!logits.empty(), "sampler: empty logits");
  apply_penalties(logits);

  if (params_.temp <= 0.0f) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
      // NaN never wins (unless every logit is NaN).
      if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i]))) best = i;
    }
    return {Candidate{static_cast<int32_t>(best), logits[best], 1.0f}};
  }

  // NaN logits become -inf: they must not break the sort's strict weak ordering.
  std::vector<Candidate> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
    c[i] = Candidate{static_cast<int32_t>(i), l, 0.0f};
  }
  bool sorted = false;

  // top-k: partial sort, O(n log k) instead of a full sort of the vocabulary.
  if (params_.top_k > 0) {
    const size_t k = std::min(static_cast<size_t>(params_.top_k), c.size());
    std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(k), c.end(), by_logit_desc);
    c.resize(k);
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

  // temperature, then the distribution the draw uses.
  for (Candidate& x : c) x.logit /= params_.temp;
  softmax(c);
  return c;
}

int32_t Sampler::sample(std::span<float> logits) {
  const std::vector<Candidate> c = candidates(logits);
  if (params_.temp <= 0.0f) return c.front().id;
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
  if (params_.repeat_last_n == 0 || token < 0) return;
  history_.push_back(token);
  ++counts_[token];
  trim_history();
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
  VKLLM_CHECK(history_.size() <= 0xFFFFFFFFu, "sampler: penalty history exceeds 2^32 tokens");
  w.put<uint32_t>(static_cast<uint32_t>(history_.size()));
  for (int32_t t : history_) w.put<int32_t>(t);
  const std::string text = rng_text(rng_);
  VKLLM_CHECK(text.size() <= kMaxRngText, "sampler: mt19937 text state is unexpectedly long");
  w.put<uint32_t>(static_cast<uint32_t>(text.size()));
  w.put_bytes(text.data(), text.size());
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
  if (version != kStateVersion) {
    r.fail("version " + std::to_string(version) + " is not supported (expected " + std::to_string(kStateVersion) + ")");
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
  validate_params(p);
  const auto seed_used = r.get<uint64_t>("seed used");

  const auto n_history = r.get<uint32_t>("history length");
  if (params_max_history(p) < n_history) {
    r.fail("history length " + std::to_string(n_history) + " exceeds repeat_last_n " + std::to_string(p.repeat_last_n));
  }
  if (static_cast<uint64_t>(n_history) * sizeof(int32_t) > r.left()) {
    r.fail("history length " + std::to_string(n_history) + " needs more bytes than the " + std::to_string(r.left()) +
           " left");
  }
  std::deque<int32_t> history;
  std::unordered_map<int32_t, int32_t> counts;
  for (uint32_t i = 0; i < n_history; ++i) {
    const auto t = r.get<int32_t>("history token");
    if (t < 0) r.fail("history token " + std::to_string(i) + " = " + std::to_string(t) + " is negative");
    history.push_back(t);
    ++counts[t];
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
  if (r.left() != 0) r.fail(std::to_string(r.left()) + " unexpected trailing bytes");

  params_ = p;
  seed_ = seed_used;
  rng_ = rng;
  history_ = std::move(history);
  counts_ = std::move(counts);
}

}  // namespace vkllm
