// Sampler: greedy, top-k/top-p/min-p candidate sets, temperature limits, llama.cpp's penalties,
// seeded determinism, save/restore continuity, and a corruption suite for restore_state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>
#include <xxhash.h>

#include "base/error.h"
#include "engine/dry.h"
#include "engine/sampler.h"

using vkllm::Candidate;
using vkllm::Sampler;
using vkllm::SamplerParams;

namespace {

// Only the named step is on; everything else off.
SamplerParams plain(float temp = 1.0f) {
  SamplerParams p;
  p.temp = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 1234;
  return p;
}

std::vector<float> log_probs(std::initializer_list<float> probs) {
  std::vector<float> l;
  for (float p : probs) l.push_back(std::log(p));
  return l;
}

std::set<int32_t> ids_of(const std::vector<Candidate>& c) {
  std::set<int32_t> s;
  for (const Candidate& x : c) s.insert(x.id);
  return s;
}

// The ids a fresh sampler with params p keeps for logits l.
std::set<int32_t> kept(const SamplerParams& p, std::vector<float> l) { return ids_of(Sampler(p).candidates(l)); }

// Token frequencies over n draws (logits copied each time: sample() modifies them).
std::map<int32_t, double> frequencies(Sampler& s, const std::vector<float>& logits, int n) {
  std::map<int32_t, double> f;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    f[s.sample(l)] += 1.0 / n;
  }
  return f;
}

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> l(n);
  for (float& x : l) x = d(g);
  return l;
}

int32_t argmax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

}  // namespace

TEST(Sampler, GreedyPicksArgmaxFirstOnTies) {
  Sampler s(plain(0.0f));
  std::vector<float> l = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(s.sample(l), 1);
  SamplerParams neg = plain(-1.0f);
  neg.top_k = 40;
  Sampler s2(neg);
  std::vector<float> l2 = {-5.0f, -1.0f, -3.0f, -1.0f};
  EXPECT_EQ(s2.sample(l2), 1);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> r = random_logits(1000, seed);
    const int32_t want = argmax(r);
    EXPECT_EQ(s.sample(r), want);
  }
}

TEST(Sampler, TopK1IsGreedy) {
  SamplerParams p = plain(1.5f);
  p.top_k = 1;
  Sampler s(p);
  for (uint32_t seed = 0; seed < 50; ++seed) {
    std::vector<float> r = random_logits(5000, seed);
    const int32_t want = argmax(r);
    EXPECT_EQ(s.sample(r), want);
  }
  std::vector<float> tie = {0.0f, 2.0f, 2.0f};
  EXPECT_EQ(s.sample(tie), 1);
}

TEST(Sampler, TopKKeepsTheKBestSorted) {
  SamplerParams p = plain();
  p.top_k = 3;
  Sampler s(p);
  std::vector<float> l = {0.1f, 5.0f, -2.0f, 4.0f, 4.5f, 3.9f};
  const auto c = s.candidates(l);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].id, 1);
  EXPECT_EQ(c[1].id, 4);
  EXPECT_EQ(c[2].id, 3);
  double sum = 0;
  for (const auto& x : c) sum += x.p;
  EXPECT_NEAR(sum, 1.0, 1e-6);
  // k larger than the vocabulary keeps everything.
  p.top_k = 100;
  Sampler big(p);
  EXPECT_EQ(big.candidates(l).size(), l.size());
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
  const auto l = log_probs({0.05f, 0.5f, 0.15f, 0.3f});
  SamplerParams p = plain();
  p.top_p = 0.75f;  // 0.5 + 0.3 = 0.8 >= 0.75
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1, 3}));
  p.top_p = 0.85f;  // needs 0.15 too
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1, 2, 3}));
  p.top_p = 0.4f;  // the top token alone
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1}));
  p.top_p = 0.0f;  // still at least one
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1}));
  p.top_p = 1.0f;  // off
  EXPECT_EQ(kept(p, l).size(), 4u);

  // The draws agree: only {1, 3}, renormalised 0.5/0.8 and 0.3/0.8.
  p.top_p = 0.75f;
  Sampler s(p);
  const auto f = frequencies(s, l, 40000);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_NEAR(f.at(1), 0.625, 0.015);
  EXPECT_NEAR(f.at(3), 0.375, 0.015);
}

TEST(Sampler, MinPKeepsTokensAboveFractionOfMax) {
  const auto l = log_probs({0.05f, 0.5f, 0.15f, 0.3f});
  SamplerParams p = plain();
  p.min_p = 0.2f;  // p >= 0.1
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1, 2, 3}));
  p.min_p = 0.5f;  // p >= 0.25
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1, 3}));
  p.min_p = 0.05f;  // p >= 0.025: all
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{0, 1, 2, 3}));
  p.min_p = 1.0f;  // the max itself: the best token alone
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1}));

  p.min_p = 0.2f;
  Sampler s(p);
  const auto f = frequencies(s, l, 40000);
  EXPECT_EQ(f.count(0), 0u);
  EXPECT_NEAR(f.at(1), 0.5 / 0.95, 0.015);
  EXPECT_NEAR(f.at(2), 0.15 / 0.95, 0.015);
  EXPECT_NEAR(f.at(3), 0.3 / 0.95, 0.015);
}

TEST(Sampler, ChainOrderTopKThenTopPThenMinP) {
  // top-k 3 keeps {1,3,2}; renormalised 0.5/0.95, 0.3/0.95, 0.15/0.95; top-p 0.8 needs 0.526+0.316.
  const auto l = log_probs({0.05f, 0.5f, 0.15f, 0.3f});
  SamplerParams p = plain();
  p.top_k = 3;
  p.top_p = 0.8f;
  p.min_p = 0.0f;
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1, 3}));
  p.min_p = 0.7f;  // then min-p drops 3 (0.3 < 0.35)
  EXPECT_EQ(kept(p, l), (std::set<int32_t>{1}));
}

TEST(Sampler, SamplingMatchesSoftmaxAtTemperatureOne) {
  const auto l = log_probs({0.1f, 0.2f, 0.3f, 0.4f});
  Sampler s(plain(1.0f));
  const auto f = frequencies(s, l, 50000);
  EXPECT_NEAR(f.at(0), 0.1, 0.01);
  EXPECT_NEAR(f.at(1), 0.2, 0.01);
  EXPECT_NEAR(f.at(2), 0.3, 0.01);
  EXPECT_NEAR(f.at(3), 0.4, 0.01);
}

TEST(Sampler, LowTemperatureApproachesGreedy) {
  Sampler s(plain(1e-3f));
  const std::vector<float> l = {1.0f, 1.1f, 0.9f, 1.05f};
  const auto f = frequencies(s, l, 2000);
  EXPECT_EQ(f.size(), 1u);
  EXPECT_NEAR(f.at(1), 1.0, 1e-9);
}

TEST(Sampler, HighTemperatureApproachesUniform) {
  Sampler s(plain(1e3f));
  std::vector<float> l(10);
  for (size_t i = 0; i < l.size(); ++i) l[i] = 0.2f * static_cast<float>(i);
  const auto f = frequencies(s, l, 50000);
  ASSERT_EQ(f.size(), 10u);
  for (const auto& [id, freq] : f) EXPECT_NEAR(freq, 0.1, 0.01) << "token " << id;
}

TEST(Sampler, PenaltiesFollowLlamaCpp) {
  SamplerParams p = plain(0.0f);
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.1f;
  p.presence_penalty = 0.5f;
  Sampler s(p);
  for (int32_t t : {0, 1, 0, 99999}) s.accept(t);  // 99999: outside this vocabulary, ignored
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
  s.sample(l);
  EXPECT_FLOAT_EQ(l[0], 2.0f / 2.0f - 2 * 0.1f - 0.5f);  // positive: divided
  EXPECT_FLOAT_EQ(l[1], -2.0f * 2.0f - 1 * 0.1f - 0.5f);  // negative: multiplied
  EXPECT_FLOAT_EQ(l[2], 1.0f);
  EXPECT_FLOAT_EQ(l[3], 0.5f);

  // The penalty changes the greedy choice.
  SamplerParams rp = plain(0.0f);
  rp.repeat_penalty = 2.0f;
  Sampler g(rp);
  std::vector<float> two = {2.0f, 1.5f};
  EXPECT_EQ(g.sample(two), 0);
  g.accept(0);
  two = {2.0f, 1.5f};
  EXPECT_EQ(g.sample(two), 1);
  g.reset();  // history forgotten
  two = {2.0f, 1.5f};
  EXPECT_EQ(g.sample(two), 0);
}

TEST(Sampler, PenaltyWindow) {
  SamplerParams p = plain(0.0f);
  p.presence_penalty = 1.0f;
  const std::vector<float> base = {0.0f, 0.0f, 0.0f, 0.0f};

  p.repeat_last_n = 2;
  Sampler win(p);
  for (int32_t t : {0, 1, 2}) win.accept(t);
  std::vector<float> l = base;
  win.sample(l);
  EXPECT_EQ(l, (std::vector<float>{0.0f, -1.0f, -1.0f, 0.0f}));  // 0 fell out of the window

  p.repeat_last_n = -1;
  Sampler all(p);
  for (int32_t t : {0, 1, 2}) all.accept(t);
  l = base;
  all.sample(l);
  EXPECT_EQ(l, (std::vector<float>{-1.0f, -1.0f, -1.0f, 0.0f}));

  p.repeat_last_n = 0;
  Sampler off(p);
  for (int32_t t : {0, 1, 2}) off.accept(t);
  l = base;
  off.sample(l);
  EXPECT_EQ(l, base);

  // Frequency counts occurrences inside the window only.
  SamplerParams fp = plain(0.0f);
  fp.frequency_penalty = 1.0f;
  fp.repeat_last_n = 3;
  Sampler freq(fp);
  for (int32_t t : {3, 3, 3, 3, 1, 3}) freq.accept(t);  // window: 3, 1, 3
  l = base;
  freq.sample(l);
  EXPECT_EQ(l, (std::vector<float>{0.0f, -1.0f, 0.0f, -2.0f}));
}

TEST(Sampler, SameSeedSameSequence) {
  SamplerParams p;  // defaults: the whole chain on
  p.seed = 42;
  p.repeat_penalty = 1.1f;
  Sampler a(p), b(p);
  EXPECT_EQ(a.seed(), 42u);
  const auto l = random_logits(2000, 7);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> la = l, lb = l;
    sa.push_back(a.sample(la));
    sb.push_back(b.sample(lb));
    a.accept(sa.back());
    b.accept(sb.back());
  }
  EXPECT_EQ(sa, sb);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> sc;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> lc = l;
    sc.push_back(c.sample(lc));
    c.accept(sc.back());
  }
  EXPECT_NE(sa, sc);
  // A 64-bit seed is used whole.
  p.seed = 0x1234567800000042ull;
  EXPECT_EQ(Sampler(p).seed(), p.seed);
}

TEST(Sampler, RandomSeedComesFromTheOs) {
  SamplerParams p;
  EXPECT_EQ(p.seed, Sampler::kRandomSeed);
  Sampler s(p);
  EXPECT_NE(s.seed(), Sampler::kRandomSeed);
  EXPECT_EQ(s.params().seed, Sampler::kRandomSeed);
}

TEST(Sampler, InvalidParamsThrow) {
  SamplerParams p;
  p.temp = NAN;
  EXPECT_THROW(Sampler{p}, vkllm::Error);
  p = {};
  p.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler{p}, vkllm::Error);
  p = {};
  p.repeat_last_n = -2;
  EXPECT_THROW(Sampler{p}, vkllm::Error);
  // top_p and min_p are probabilities, as the server reads them.
  for (const float v : {-0.1f, 1.5f, NAN}) {
    p = {};
    p.top_p = v;
    EXPECT_THROW(Sampler{p}, vkllm::Error) << "top_p " << v;
    p = {};
    p.min_p = v;
    EXPECT_THROW(Sampler{p}, vkllm::Error) << "min_p " << v;
  }
}

TEST(Sampler, LargeVocabularyTopK) {
  SamplerParams p;
  p.seed = 5;
  Sampler s(p);
  const auto l = random_logits(151936, 11);
  std::vector<float> sorted = l;
  std::nth_element(sorted.begin(), sorted.begin() + 39, sorted.end(), std::greater<float>());
  const float kth = sorted[39];
  for (int i = 0; i < 20; ++i) {
    std::vector<float> x = l;
    const int32_t t = s.sample(x);
    EXPECT_GE(l[static_cast<size_t>(t)], kth);
  }
}

namespace {

// A sampler with everything on, some history and k draws behind it.
Sampler busy_sampler(int k, std::vector<float>& logits) {
  SamplerParams p;
  p.seed = 777;
  p.repeat_penalty = 1.3f;
  p.frequency_penalty = 0.2f;
  p.presence_penalty = 0.1f;
  p.repeat_last_n = 16;
  p.top_k = 50;
  p.temp = 1.2f;
  Sampler s(p);
  logits = random_logits(3000, 3);
  for (int32_t t : {5, 17, 5, 2999}) s.accept(t);
  for (int i = 0; i < k; ++i) {
    std::vector<float> l = logits;
    s.accept(s.sample(l));
  }
  return s;
}

std::vector<int32_t> draws(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    out.push_back(s.sample(l));
    s.accept(out.back());
  }
  return out;
}

// Recomputes the trailing XXH64 so a deliberately edited blob gets past the checksum.
void reseal(std::vector<uint8_t>& b) {
  const uint64_t h = XXH64(b.data(), b.size() - 8, 0);
  std::memcpy(b.data() + b.size() - 8, &h, 8);
}

template <typename T>
std::vector<uint8_t> with_field(std::vector<uint8_t> b, size_t offset, T v) {
  std::memcpy(b.data() + offset, &v, sizeof(T));
  reseal(b);
  return b;
}

// The blob with its RNG text (at offset rng_at) replaced by `text`, what follows it (version 2's
// fields) kept, resealed.
std::vector<uint8_t> with_rng_text(const std::vector<uint8_t>& blob, size_t rng_at, const std::string& text) {
  uint32_t old_len;
  std::memcpy(&old_len, blob.data() + rng_at, 4);
  std::vector<uint8_t> b(blob.begin(), blob.begin() + static_cast<ptrdiff_t>(rng_at));
  const auto len = static_cast<uint32_t>(text.size());
  b.resize(b.size() + 4);
  std::memcpy(b.data() + rng_at, &len, 4);
  b.insert(b.end(), text.begin(), text.end());
  b.insert(b.end(), blob.begin() + static_cast<ptrdiff_t>(rng_at + 4 + old_len), blob.end());
  reseal(b);
  return b;
}

}  // namespace

TEST(SamplerState, RestoreContinuesIdentically) {
  std::vector<float> logits;
  Sampler a = busy_sampler(37, logits);
  const std::vector<uint8_t> blob = a.save_state();
  Sampler b(SamplerParams{});  // different params and seed; restore replaces them
  b.restore_state(blob);
  EXPECT_EQ(b.seed(), 777u);
  EXPECT_EQ(b.params().top_k, 50);
  EXPECT_FLOAT_EQ(b.params().repeat_penalty, 1.3f);
  EXPECT_EQ(b.save_state(), blob);
  EXPECT_EQ(draws(a, logits, 100), draws(b, logits, 100));
}

TEST(SamplerState, EveryTruncationThrows) {
  std::vector<float> logits;
  Sampler a = busy_sampler(5, logits);
  const std::vector<uint8_t> blob = a.save_state();
  Sampler b(SamplerParams{});
  for (size_t n = 0; n < blob.size(); ++n) {
    EXPECT_THROW(b.restore_state(std::span(blob).first(n)), vkllm::Error) << "length " << n;
  }
  std::vector<uint8_t> longer = blob;
  longer.push_back(0);
  EXPECT_THROW(b.restore_state(longer), vkllm::Error);
}

TEST(SamplerState, EveryByteFlipThrowsAndLeavesSamplerUnchanged) {
  std::vector<float> logits;
  Sampler a = busy_sampler(5, logits);
  const std::vector<uint8_t> blob = a.save_state();
  Sampler b = busy_sampler(5, logits);
  for (size_t i = 0; i < blob.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::vector<uint8_t> bad = blob;
      bad[i] ^= mask;
      EXPECT_THROW(b.restore_state(bad), vkllm::Error) << "byte " << i;
    }
  }
  EXPECT_EQ(draws(a, logits, 50), draws(b, logits, 50));
}

TEST(SamplerState, HostileFieldsWithValidChecksumThrow) {
  std::vector<float> logits;
  Sampler a = busy_sampler(3, logits);
  const std::vector<uint8_t> blob = a.save_state();
  // Offsets from docs/sampling.md; the history length (u32 at 56) places the RNG text.
  uint32_t n_hist;
  std::memcpy(&n_hist, blob.data() + 56, 4);
  ASSERT_EQ(n_hist, 7u);  // 4 accepted + 3 drawn
  const size_t rng_at = 60 + 4 * size_t{n_hist};
  const std::vector<std::vector<uint8_t>> bad = {
      with_field<uint8_t>(blob, 0, 'X'),                                    // magic
      with_field<uint32_t>(blob, 4, 3),                                     // version
      with_field<float>(blob, 8, NAN),                                      // temp
      with_field<float>(blob, 16, INFINITY),                                // top_p
      with_field<float>(blob, 24, -1.0f),                                   // repeat_penalty
      with_field<int32_t>(blob, 36, -7),                                    // repeat_last_n
      with_field<int32_t>(blob, 36, static_cast<int32_t>(n_hist) - 1),     // window < history
      with_field<uint32_t>(blob, 56, 0xFFFFFFFFu),                          // history length
      with_field<uint32_t>(blob, 56, n_hist + 1),                           // off by one
      with_field<uint32_t>(blob, 56, n_hist - 1),                           // off by one
      with_field<int32_t>(blob, 60, -3),                                    // negative token
      with_field<uint32_t>(blob, rng_at, 0xFFFFFFF0u),                      // rng text length
      with_field<uint32_t>(blob, rng_at, 5),                                // rng text too short
      with_field<uint8_t>(blob, rng_at + 4, 'a'),                           // rng text: a letter
  };
  Sampler b(SamplerParams{});
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_THROW(b.restore_state(bad[i]), vkllm::Error) << "case " << i;
  }
  // Well-formed text that is not an mt19937 state, or whose words exceed 32 bits.
  const std::string good = [&] {
    uint32_t n;
    std::memcpy(&n, blob.data() + rng_at, 4);
    return std::string(blob.begin() + static_cast<ptrdiff_t>(rng_at) + 4,
                       blob.begin() + static_cast<ptrdiff_t>(rng_at) + 4 + n);
  }();
  EXPECT_NO_THROW(b.restore_state(with_rng_text(blob, rng_at, good)));
  const std::string bad_texts[] = {"", "1 2 3", "99999999999" + good.substr(good.find(' ')),
                                   "4294967296" + good.substr(good.find(' ')), good + " 7"};
  for (const std::string& t : bad_texts) {
    EXPECT_THROW(b.restore_state(with_rng_text(blob, rng_at, t)), vkllm::Error) << t.substr(0, 30);
  }
  // Random garbage of many lengths.
  std::mt19937 g(9);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> junk(g() % 300);
    for (uint8_t& x : junk) x = static_cast<uint8_t>(g());
    EXPECT_THROW(b.restore_state(junk), vkllm::Error);
  }
}

TEST(Sampler, NanLogitsNeverWin) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> l = {nan, 1.0f, nan, 2.0f};
  Sampler g(plain(0.0f));
  EXPECT_EQ(g.sample(l), 3);
  SamplerParams p = plain(1.0f);
  p.top_k = 2;
  Sampler s(p);
  for (int i = 0; i < 100; ++i) {
    std::vector<float> x = {nan, 1.0f, nan, 2.0f};
    const int32_t t = s.sample(x);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, TopPWithoutTopKMatchesFullSort) {
  const auto l = random_logits(151936, 21);
  // Reference: full sort, softmax, smallest prefix reaching p.
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
  });
  const float m = l[order[0]];
  double sum = 0;
  for (float x : l) sum += std::exp(x - m);
  for (float top_p : {0.5f, 0.95f, 0.999f}) {
    size_t want = 0;
    double cum = 0;
    while (cum < top_p) cum += std::exp(l[order[want++]] - m) / sum;
    SamplerParams p = plain();
    p.top_p = top_p;
    std::vector<float> x = l;
    const auto c = Sampler(p).candidates(x);
    ASSERT_EQ(c.size(), want) << "top_p " << top_p;
    for (size_t i = 0; i < want; ++i) ASSERT_EQ(c[i].id, order[i]) << "top_p " << top_p << " rank " << i;
  }
}

// Locally typical sampling keeps the tokens whose surprise is nearest the entropy, nearest first:
// p = 0.5, 0.3, 0.15, 0.05 has entropy 1.142 nats and surprises 0.693, 1.204, 1.897, 2.996, so
// token 1 comes first, then 0; the most likely token is not always kept.
TEST(Sampler, TypicalKeepsTokensNearestTheEntropy) {
  SamplerParams p = plain(1.0f);
  p.typical_p = 0.2f;
  EXPECT_EQ(kept(p, log_probs({0.5f, 0.3f, 0.15f, 0.05f})), (std::set<int32_t>{1}));
  p.typical_p = 0.5f;
  EXPECT_EQ(kept(p, log_probs({0.5f, 0.3f, 0.15f, 0.05f})), (std::set<int32_t>{0, 1}));
  p.typical_p = 0.9f;
  EXPECT_EQ(kept(p, log_probs({0.5f, 0.3f, 0.15f, 0.05f})), (std::set<int32_t>{0, 1, 2}));
  p.typical_p = 1.0f;  // off
  EXPECT_EQ(kept(p, log_probs({0.5f, 0.3f, 0.15f, 0.05f})), (std::set<int32_t>{0, 1, 2, 3}));
}

// top-n-sigma: logits 0, 1, 2, 10 have mean 3.25 and deviation 3.961, so one sigma keeps the
// best alone and 2.5 sigmas keep all but 0 (the floor 0.098); -inf logits are left out of both.
TEST(Sampler, TopNSigmaKeepsLogitsNearTheBest) {
  const float inf = std::numeric_limits<float>::infinity();
  SamplerParams p = plain(1.0f);
  p.top_n_sigma = 1.0f;
  EXPECT_EQ(kept(p, {0.0f, 1.0f, 2.0f, 10.0f}), (std::set<int32_t>{3}));
  EXPECT_EQ(kept(p, {0.0f, 1.0f, -inf, 2.0f, 10.0f}), (std::set<int32_t>{4}));
  p.top_n_sigma = 2.5f;
  EXPECT_EQ(kept(p, {0.0f, 1.0f, 2.0f, 10.0f}), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(kept(p, {0.0f, 1.0f, -inf, 2.0f, 10.0f}), (std::set<int32_t>{1, 3, 4}));
  p.top_n_sigma = -1.0f;
  EXPECT_EQ(kept(p, {0.0f, 1.0f, 2.0f, 10.0f}).size(), 4u);
}

// XTC removes every token whose probability reaches the threshold but the least likely of them,
// on a step chosen with xtc_probability; greedy then takes the best that is left.
TEST(Sampler, XtcExcludesTheTopChoices) {
  SamplerParams p = plain(0.0f);
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.25f;
  const std::vector<float> l = log_probs({0.4f, 0.3f, 0.2f, 0.1f});
  std::vector<float> x = l;
  EXPECT_EQ(Sampler(p).sample(x), 1);  // 0 and 1 reach 0.25: 0 goes
  p.xtc_threshold = 0.35f;             // only 0 reaches it: nothing goes
  x = l;
  EXPECT_EQ(Sampler(p).sample(x), 0);
  p.xtc_threshold = 0.1f;  // all four reach it: all but 3 go
  x = l;
  EXPECT_EQ(Sampler(p).sample(x), 3);
  p.xtc_threshold = 0.6f;  // past 0.5: off
  x = l;
  EXPECT_EQ(Sampler(p).sample(x), 0);
  // Half the steps: token 1 about half the time.
  p.xtc_threshold = 0.25f;
  p.xtc_probability = 0.5f;
  Sampler half(p);
  const auto f = frequencies(half, l, 4000);
  EXPECT_NEAR(f.count(1) ? f.at(1) : 0.0, 0.5, 0.04);
  EXPECT_NEAR(f.count(0) ? f.at(0) : 0.0, 0.5, 0.04);
  // Sampled: the removed token is never drawn.
  p = plain(1.0f);
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.25f;
  Sampler s(p);
  EXPECT_EQ(frequencies(s, l, 2000).count(0), 0u);
}

// Mirostat 2 keeps the tokens whose surprise is at most mu (2·tau at the start), draws, and moves
// mu by eta times the draw's surprise (under the kept tokens' renormalised probabilities) less tau.
TEST(Sampler, MirostatV2CutsBySurpriseAndLearns) {
  SamplerParams p = plain(1.0f);
  p.mirostat = 2;
  p.mirostat_tau = 1.0f;
  p.mirostat_eta = 0.1f;
  const std::vector<float> l = log_probs({0.5f, 0.25f, 0.125f, 0.125f});  // surprises 1, 2, 3, 3 bits
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    p.seed = seed;
    Sampler s(p);
    EXPECT_FLOAT_EQ(s.mirostat_mu(), 2.0f);
    std::vector<float> x = l;
    const int32_t t = s.sample(x);
    ++seen[t];
    const double q = t == 0 ? 2.0 / 3.0 : 1.0 / 3.0;  // renormalised over tokens 0 and 1
    EXPECT_NEAR(s.mirostat_mu(), 2.0 - 0.1 * (-std::log2(q) - 1.0), 1e-5);
  }
  EXPECT_EQ(seen.size(), 2u);  // 2 and 3 (3 bits) never
  EXPECT_NEAR(seen[0] / 300.0, 2.0 / 3.0, 0.09);
  // Greedy stays greedy.
  p.temp = 0.0f;
  std::vector<float> x = log_probs({0.1f, 0.6f, 0.3f});
  EXPECT_EQ(Sampler(p).sample(x), 1);
}

// Mirostat 1 keeps the top k, k from the estimated Zipf exponent and mu: at tau 0 (mu 0) k is 1.
TEST(Sampler, MirostatV1AtZeroSurpriseIsGreedy) {
  SamplerParams p = plain(1.0f);
  p.mirostat = 1;
  p.mirostat_tau = 0.0f;
  const std::vector<float> l = random_logits(500, 11);
  Sampler s(p);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> x = l;
    EXPECT_EQ(s.sample(x), argmax(l));
  }
  // A larger target lets more than the best through.
  p.mirostat_tau = 8.0f;
  Sampler wide(p);
  EXPECT_GT(frequencies(wide, l, 400).size(), 1u);
}

// The state of every step added in version 2 (mirostat's mu, the DRY breakers, XTC's draws)
// survives a save and restore; version 1 blobs load with those steps off.
TEST(SamplerState, VersionTwoFieldsRoundTrip) {
  SamplerParams p = plain(0.9f);
  p.seed = 99;
  p.typical_p = 0.95f;
  p.top_n_sigma = 3.0f;
  p.xtc_probability = 0.3f;
  p.xtc_threshold = 0.05f;
  p.dry_base = 2.5f;
  p.dry_allowed_length = 4;
  p.dry_penalty_last_n = 17;
  p.dry_sequence_breakers = {"\n", "é", ""};
  p.repeat_last_n = 8;
  const std::vector<float> logits = random_logits(300, 5);
  for (int mirostat : {0, 2}) {
    p.mirostat = mirostat;
    p.mirostat_tau = 3.0f;
    Sampler a(p);
    draws(a, logits, 23);
    Sampler b(SamplerParams{});
    const std::vector<uint8_t> blob = a.save_state();
    b.restore_state(blob);
    EXPECT_EQ(b.params(), a.params());
    EXPECT_EQ(b.mirostat_mu(), a.mirostat_mu());
    EXPECT_EQ(b.save_state(), blob);
    EXPECT_EQ(draws(a, logits, 60), draws(b, logits, 60));
  }
  // A version 1 blob: version 2's fields cut off, the version word set to 1.
  Sampler a(plain(0.7f));
  draws(a, logits, 5);
  std::vector<uint8_t> v1 = a.save_state();
  uint32_t n_hist, rng_len;
  std::memcpy(&n_hist, v1.data() + 56, 4);
  std::memcpy(&rng_len, v1.data() + 60 + 4 * size_t{n_hist}, 4);
  v1.resize(60 + 4 * size_t{n_hist} + 4 + rng_len + 8);
  v1 = with_field<uint32_t>(v1, 4, 1);
  Sampler b(p);
  b.restore_state(v1);
  EXPECT_EQ(b.params().dry_multiplier, 0.0f);
  EXPECT_EQ(b.params().mirostat, 0);
  EXPECT_EQ(b.params().xtc_probability, 0.0f);
  EXPECT_EQ(draws(a, logits, 30), draws(b, logits, 30));
}

TEST(Sampler, NewParamsOutOfRangeThrow) {
  const auto bad = [](auto set) {
    SamplerParams p;
    set(p);
    EXPECT_THROW(Sampler{p}, vkllm::Error);
  };
  bad([](SamplerParams& p) { p.typical_p = 1.5f; });
  bad([](SamplerParams& p) { p.top_n_sigma = NAN; });
  bad([](SamplerParams& p) { p.xtc_probability = -0.1f; });
  bad([](SamplerParams& p) { p.xtc_threshold = 2.0f; });
  bad([](SamplerParams& p) { p.dry_multiplier = -1.0f; });
  bad([](SamplerParams& p) { p.dry_base = 0.5f; });
  bad([](SamplerParams& p) { p.dry_allowed_length = -1; });
  bad([](SamplerParams& p) { p.dry_penalty_last_n = -1; });
  bad([](SamplerParams& p) { p.mirostat = 3; });
  bad([](SamplerParams& p) { p.mirostat_eta = INFINITY; });
  bad([](SamplerParams& p) { p.dry_sequence_breakers.assign(65, "x"); });
}

// DRY on a history of token ids: the token that followed an earlier occurrence of the history's
// last tokens is penalised by multiplier · base^(repeat length − allowed length), the longest
// repeat counting; a single-token breaker is never penalised, and no repeat reaches back past a
// breaker (with its tail, for a breaker of several tokens).
TEST(Dry, PenalisesTheTokenThatExtendsARepeat) {
  const auto penalties = [](std::vector<int32_t> h, const vkllm::DryBreakers& b, int32_t allowed = 2, uint64_t window = 64) {
    std::vector<float> l(8, 0.0f);
    vkllm::dry_penalize(l, std::deque<int32_t>(h.begin(), h.end()), b, {0.8f, 2.0f, allowed, window});
    return l;
  };
  const vkllm::DryBreakers none;
  // 1 2 3 … 1 2: "1 2" repeats (length 2), and 3 followed it.
  EXPECT_EQ(penalties({1, 2, 3, 5, 1, 2}, none), (std::vector<float>{0, 0, 0, -0.8f, 0, 0, 0, 0}));
  // 1 2 3 4 … 1 2 3: length 3, 4 followed: 0.8 · 2.
  EXPECT_EQ(penalties({1, 2, 3, 4, 6, 1, 2, 3}, none), (std::vector<float>{0, 0, 0, 0, -1.6f, 0, 0, 0}));
  // Shorter than allowed: nothing; allowed 1: the single repeated token's successors.
  EXPECT_EQ(penalties({1, 3, 5, 1}, none), std::vector<float>(8, 0.0f));
  EXPECT_EQ(penalties({1, 3, 5, 1}, none, 1), (std::vector<float>{0, 0, 0, -0.8f, 0, 0, 0, 0}));
  // Two earlier repeats of different lengths: each successor by its own longest.
  EXPECT_EQ(penalties({7, 1, 2, 4, 0, 1, 2, 5, 0, 1, 2}, none), (std::vector<float>{0, 0, 0, 0, -0.8f, -1.6f, 0, 0}));
  // The window: the earlier "1 2 3" out of the last 5 tokens.
  EXPECT_EQ(penalties({1, 2, 3, 5, 6, 1, 2}, none, 2, 5), std::vector<float>(8, 0.0f));
  // Token 3 a single-token breaker: never penalised, and the repeat cannot span it.
  vkllm::DryBreakers three;
  three.tails.emplace(3, std::vector<int32_t>{});
  EXPECT_EQ(penalties({1, 2, 3, 5, 1, 2}, three), std::vector<float>(8, 0.0f));
  // "4 3 1 2" repeats, but a repeat counts only the 2 tokens after the breaker: 0.8, not 0.8 · 2².
  EXPECT_EQ(penalties({1, 2, 4, 3, 1, 2, 4, 3, 1, 2}, three), (std::vector<float>{0, 0, 0, 0, -0.8f, 0, 0, 0}));
  EXPECT_EQ(penalties({1, 2, 4, 7, 3, 1, 2}, three), (std::vector<float>{0, 0, 0, 0, -0.8f, 0, 0, 0}));
  // A two-token breaker "6 7" (head 6, tail 7): only the whole pair breaks a repeat.
  vkllm::DryBreakers pair;
  pair.tails.emplace(6, std::vector<int32_t>{7});
  EXPECT_EQ(penalties({1, 2, 4, 6, 7, 1, 2}, pair), (std::vector<float>{0, 0, 0, 0, -0.8f, 0, 0, 0}));
  // "6 5 1 2" repeats (length 4: 0.8 · 2²) where 6 is not followed by 7; after "6 7" only "5 1 2" counts.
  EXPECT_EQ(penalties({6, 5, 1, 2, 4, 0, 6, 5, 1, 2}, pair), (std::vector<float>{0, 0, 0, 0, -3.2f, 0, 0, 0}));
  EXPECT_EQ(penalties({6, 7, 5, 1, 2, 4, 0, 6, 7, 5, 1, 2}, pair), (std::vector<float>{0, 0, 0, 0, -1.6f, 0, 0, 0}));
}
