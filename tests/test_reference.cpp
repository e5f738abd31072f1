// The scalar references themselves: dequantization against llama-quantize's files, quantizer round
// trips, f16 rounding, RoPE and attention against independent computations. Everything the shader
// tests compare with is checked here first.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf.h"
#include "reference/ref_forward.h"
#include "reference/ref_blocks.h"
#include "reference/ref_ops.h"
#include "test_support.h"

using gguf::TensorType;
using vkllm::test::shared_path;
namespace ref = vkllm::ref;

namespace {

constexpr TensorType kAllTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0,
                                    TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0,
                                    TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                                    TensorType::Q6_K};

// Upper bounds on the normalised MSE of a type's round trip on Gaussian weights, about 2-3x
// what correct code measures (F16 4e-8, BF16 3e-6, Q8_0 3e-5, Q6_K 3e-4, Q5_* 1.3-1.9e-3,
// Q4_* 5-7.8e-3, Q3_K 2.3-2.5e-2, Q2_K 8.8e-2 from llama-quantize, 1.1e-1 from ours). A layout
// bug (nibble order, bit plane, scale unpacking) gives ~1.
const std::map<TensorType, double> kNmseBound = {
    {TensorType::F32, 0.0},    {TensorType::F16, 1e-7},   {TensorType::BF16, 1e-5}, {TensorType::Q8_0, 1e-4},
    {TensorType::Q6_K, 1e-3},  {TensorType::Q5_0, 5e-3},  {TensorType::Q5_1, 5e-3}, {TensorType::Q5_K, 5e-3},
    {TensorType::Q4_0, 2e-2},  {TensorType::Q4_1, 2e-2},  {TensorType::Q4_K, 2e-2}, {TensorType::Q3_K, 6e-2},
    {TensorType::Q2_K, 2.5e-1}};

// Normalised mean squared error: sum (a-b)² / sum b².
double nmse(const float* a, const float* b, size_t n) {
  double err = 0.0, ref_sq = 0.0;
  for (size_t i = 0; i < n; ++i) {
    err += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    ref_sq += double{b[i]} * b[i];
  }
  return ref_sq > 0.0 ? err / ref_sq : err;
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> dequantize_tensor(const gguf::TensorInfo& t) {
  std::vector<float> out(t.n_elements);
  const int64_t n_cols = static_cast<int64_t>(t.ne[0]);
  const uint64_t row_bytes = gguf::type_bytes(t.type, t.ne[0]);
  for (uint64_t r = 0; r < t.n_elements / t.ne[0]; ++r)
    ref::dequantize_row(t.type, t.data + r * row_bytes, out.data() + r * t.ne[0], n_cols);
  return out;
}

std::vector<uint8_t> quantize(TensorType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(gguf::type_bytes(t, x.size()));
  ref::quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> dequantize(TensorType t, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> y(n);
  ref::dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(n));
  return y;
}

}  // namespace

TEST(Reference, BlockStructsMatchTheGgufTypeTable) {
  const std::pair<TensorType, size_t> sizes[] = {
      {TensorType::Q4_0, sizeof(ref::BlockQ4_0)}, {TensorType::Q4_1, sizeof(ref::BlockQ4_1)},
      {TensorType::Q5_0, sizeof(ref::BlockQ5_0)}, {TensorType::Q5_1, sizeof(ref::BlockQ5_1)},
      {TensorType::Q8_0, sizeof(ref::BlockQ8_0)}, {TensorType::Q2_K, sizeof(ref::BlockQ2_K)},
      {TensorType::Q3_K, sizeof(ref::BlockQ3_K)}, {TensorType::Q4_K, sizeof(ref::BlockQ4_K)},
      {TensorType::Q5_K, sizeof(ref::BlockQ5_K)}, {TensorType::Q6_K, sizeof(ref::BlockQ6_K)}};
  for (const auto& [t, size] : sizes) EXPECT_EQ(gguf::type_info(static_cast<uint32_t>(t))->block_bytes, size) << gguf::type_name(t);
  for (TensorType t : kAllTypes) EXPECT_TRUE(ref::is_supported(t)) << gguf::type_name(t);
  EXPECT_FALSE(ref::is_supported(TensorType::IQ2_XXS));
}

TEST(Reference, Fp16KnownValues) {
  EXPECT_EQ(ref::f32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(ref::f32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(ref::f32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(ref::f32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(ref::f32_to_fp16(65520.0f), 0x7c00);  // the tie rounds up to inf
  EXPECT_EQ(ref::f32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(ref::f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);          // tie to even: 0
  EXPECT_EQ(ref::f32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);          // 1.5 units: tie to even: 2
  EXPECT_EQ(ref::f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);   // tie to even
  EXPECT_EQ(ref::f32_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);   // tie to even, upwards
  EXPECT_EQ(ref::f32_to_fp16(std::ldexp(1023.5f, -24)), 0x0400);       // subnormal carries into normal
  EXPECT_EQ(ref::f32_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(ref::f32_to_fp16(-INFINITY), 0xfc00);
  EXPECT_TRUE(std::isnan(ref::fp16_to_f32(ref::f32_to_fp16(NAN))));
  EXPECT_EQ(ref::fp16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(ref::fp16_to_f32(0x8001), -std::ldexp(1.0f, -24));
}

TEST(Reference, Fp16RoundTripsAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads
    ASSERT_EQ(ref::f32_to_fp16(ref::fp16_to_f32(static_cast<uint16_t>(h))), h);
  }
  // Random magnitudes over the whole half range: the result is a nearest half, even on ties.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> expo(-27.0f, 15.99f);  // up to ~65000 < 65504
  for (int i = 0; i < 200000; ++i) {
    const float f = std::exp2(expo(rng));
    const uint16_t h = ref::f32_to_fp16(f);
    ASSERT_LT(h, 0x7c00) << f;
    const double err = std::fabs(double{f} - ref::fp16_to_f32(h));
    for (int step : {-1, 1}) {
      const int nb = h + step;
      if (nb < 0 || nb >= 0x7c00) continue;
      const double err_nb = std::fabs(double{f} - ref::fp16_to_f32(static_cast<uint16_t>(nb)));
      ASSERT_LE(err, err_nb) << f;
      if (err == err_nb) {
        ASSERT_EQ(h % 2, 0) << f;
      }
    }
  }
}

TEST(Reference, Bf16) {
  EXPECT_EQ(ref::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(ref::bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(ref::bf16_to_f32(0xc040), -3.0f);
  uint32_t tie_even = 0x3f808000, tie_odd = 0x3f818000, above = 0x3f808001;
  EXPECT_EQ(ref::f32_to_bf16(std::bit_cast<float>(tie_even)), 0x3f80);
  EXPECT_EQ(ref::f32_to_bf16(std::bit_cast<float>(tie_odd)), 0x3f82);
  EXPECT_EQ(ref::f32_to_bf16(std::bit_cast<float>(above)), 0x3f81);
  EXPECT_TRUE(std::isnan(ref::bf16_to_f32(ref::f32_to_bf16(NAN))));
}

// Every tensor of every llama-quantize output, dequantized, against the F32 model it was made
// from. A wrong nibble order, bit plane or scale unpacking gives an NMSE near 1; the bounds sit
// a few times above what correct code measures for each type's bits.
TEST(Reference, DequantizeMatchesLlamaQuantizeFiles) {
  VKLLM_REQUIRE_SHARED("models/synth-llama-f32.gguf");
  const gguf::File f32 = gguf::File::open(shared_path("models/synth-llama-f32.gguf"));
  struct Acc {
    double err = 0, ref_sq = 0, worst = 0;
    int n_tensors = 0;
  };
  std::map<TensorType, Acc> acc;
  int n_files = 0;
  for (const char* name : {"f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q5_0", "q5_1", "q4_0", "q4_1", "q4_k_m",
                           "q3_k_m", "q2_k"}) {
    const std::string rel = std::string("models/synth-llama-") + name + ".gguf";
    if (!vkllm::test::shared_exists(rel)) {
      ADD_FAILURE() << vkllm::test::missing_message(rel);
      continue;
    }
    ++n_files;
    const gguf::File q = gguf::File::open(shared_path(rel));
    ASSERT_EQ(q.tensors().size(), f32.tensors().size()) << rel;
    for (const gguf::TensorInfo& t : q.tensors()) {
      const gguf::TensorInfo* src = f32.find_tensor(t.name);
      ASSERT_NE(src, nullptr) << rel << ": " << t.name;
      ASSERT_EQ(src->type, TensorType::F32);
      ASSERT_EQ(src->n_elements, t.n_elements) << t.name;
      ASSERT_TRUE(ref::is_supported(t.type)) << rel << ": " << t.name << " " << gguf::type_name(t.type);
      const std::vector<float> got = dequantize_tensor(t);
      const float* want = reinterpret_cast<const float*>(src->data);
      const double e = nmse(got.data(), want, got.size());
      EXPECT_LE(e, kNmseBound.at(t.type)) << rel << ": '" << t.name << "' " << gguf::type_name(t.type);
      Acc& a = acc[t.type];
      for (size_t i = 0; i < got.size(); ++i) {
        a.err += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
        a.ref_sq += double{want[i]} * want[i];
      }
      a.worst = std::max(a.worst, e);
      ++a.n_tensors;
    }
  }
  std::printf("  %-6s %8s %12s %12s\n", "type", "tensors", "NMSE", "worst");
  for (const auto& [t, a] : acc)
    std::printf("  %-6s %8d %12.3e %12.3e\n", gguf::type_name(t).c_str(), a.n_tensors, a.err / a.ref_sq, a.worst);
  EXPECT_EQ(n_files, 12);
  for (TensorType t : kAllTypes) EXPECT_GT(acc[t].n_tensors, 0) << "no " << gguf::type_name(t) << " tensor seen";
}

// llama-quantize without an importance matrix runs ggml's *_ref quantizers for the legacy types,
// so re-quantizing the F32 weights must reproduce the files' bytes exactly.
TEST(Reference, LegacyQuantizersReproduceLlamaQuantizeBytes) {
  VKLLM_REQUIRE_SHARED("models/synth-llama-f32.gguf");
  const gguf::File f32 = gguf::File::open(shared_path("models/synth-llama-f32.gguf"));
  const std::pair<const char*, TensorType> files[] = {{"q8_0", TensorType::Q8_0}, {"q4_0", TensorType::Q4_0},
                                                      {"q4_1", TensorType::Q4_1}, {"q5_0", TensorType::Q5_0},
                                                      {"q5_1", TensorType::Q5_1}};
  for (const auto& [name, type] : files) {
    const std::string rel = std::string("models/synth-llama-") + name + ".gguf";
    VKLLM_REQUIRE_SHARED(rel);
    const gguf::File q = gguf::File::open(shared_path(rel));
    int n_checked = 0;
    for (const gguf::TensorInfo& t : q.tensors()) {
      if (t.type != type) continue;
      const gguf::TensorInfo* src = f32.find_tensor(t.name);
      std::vector<uint8_t> mine(t.n_bytes);
      ref::quantize_row(type, reinterpret_cast<const float*>(src->data), mine.data(), static_cast<int64_t>(t.n_elements));
      EXPECT_EQ(std::memcmp(mine.data(), t.data, t.n_bytes), 0) << rel << ": '" << t.name << "'";
      ++n_checked;
    }
    EXPECT_GT(n_checked, 0) << rel;
  }
}

TEST(Reference, QuantizeRoundTrips) {
  // N(0,1) data with a few outliers, under the same bounds as the llama-quantize files.
  std::vector<float> x = gaussian(64 * 256, 1);
  x[5] = 9.0f;
  x[3000] = -7.5f;
  for (TensorType t : kAllTypes) {
    const std::vector<float> y = dequantize(t, quantize(t, x), x.size());
    const double e = nmse(y.data(), x.data(), x.size());
    std::printf("  round trip %-5s NMSE %.3e\n", gguf::type_name(t).c_str(), e);
    EXPECT_LE(e, kNmseBound.at(t)) << gguf::type_name(t);
    // Degenerate rows: all zero stays zero; a constant row stays close to the constant.
    for (float c : {0.0f, -0.75f, 2.0f}) {
      const std::vector<float> flat(256, c);
      const std::vector<float> yf = dequantize(t, quantize(t, flat), flat.size());
      for (float v : yf) ASSERT_NEAR(v, c, 0.02f * std::fabs(c)) << gguf::type_name(t) << " constant " << c;
    }
  }
}

TEST(Reference, KvQuantizersUseTheFullRange) {
  std::vector<float> x = gaussian(32, 3);
  x[7] = -4.0f;  // the largest magnitude
  std::vector<uint8_t> q8(gguf::type_bytes(TensorType::Q8_0, 32)), q4(gguf::type_bytes(TensorType::Q4_0, 32));
  ref::quantize_row_q8_0(x.data(), q8.data(), 32);
  ref::quantize_row_q4_0(x.data(), q4.data(), 32);
  ref::BlockQ8_0 b8;
  ref::BlockQ4_0 b4;
  std::memcpy(&b8, q8.data(), sizeof b8);
  std::memcpy(&b4, q4.data(), sizeof b4);
  EXPECT_EQ(b8.qs[7], -127);
  EXPECT_EQ(ref::fp16_to_f32(b8.d), ref::fp16_to_f32(ref::f32_to_fp16(4.0f / 127.0f)));
  EXPECT_EQ(b4.qs[7] & 0x0f, 0);  // -4 = d * (0 - 8) with d = 0.5
  EXPECT_EQ(ref::fp16_to_f32(b4.d), 0.5f);
}

TEST(Reference, RopeHandComputedValues) {
  // head_dim 4, all rotated, base 10000: pair 0 turns by pos, pair 1 by pos * 10000^(-1/2) = pos/100.
  ref::RopeParams p;
  p.head_dim = 4;
  p.n_rot = 4;
  const int32_t pos[] = {1};
  float out[4];
  const float normal_in[] = {1, 0, 1, 0};
  ref::rope(normal_in, pos, 1, 1, p, out);
  const float normal_want[] = {std::cos(1.0f), std::sin(1.0f), std::cos(0.01f), std::sin(0.01f)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], normal_want[i], 1e-6f) << i;

  p.style = vkllm::RopeStyle::NeoX;  // pairs (0, 2) and (1, 3)
  const float neox_in[] = {1, 1, 0, 0};
  ref::rope(neox_in, pos, 1, 1, p, out);
  const float neox_want[] = {std::cos(1.0f), std::cos(0.01f), std::sin(1.0f), std::sin(0.01f)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], neox_want[i], 1e-6f) << i;

  // freq_scale 0.5 and a freq factor of 4 on pair 0: angle 3 * 0.5 / 4 for pair 0, 3 * 0.5 / 100 for pair 1.
  const float factors[] = {4.0f, 1.0f};
  p.style = vkllm::RopeStyle::Normal;
  p.freq_scale = 0.5f;
  p.freq_factors = factors;
  const int32_t pos3[] = {3};
  ref::rope(normal_in, pos3, 1, 1, p, out);
  EXPECT_NEAR(out[0], std::cos(0.375f), 1e-6f);
  EXPECT_NEAR(out[1], std::sin(0.375f), 1e-6f);
  EXPECT_NEAR(out[2], std::cos(0.015f), 1e-6f);
  EXPECT_NEAR(out[3], std::sin(0.015f), 1e-6f);
}

TEST(Reference, RopeInverseAndPartialRotation) {
  for (vkllm::RopeStyle style : {vkllm::RopeStyle::Normal, vkllm::RopeStyle::NeoX}) {
    ref::RopeParams p;
    p.head_dim = 64;
    p.n_rot = 32;  // the last 32 elements pass through
    p.freq_base = 500000.0f;
    p.style = style;
    const int64_t n_tok = 5, n_heads = 3;
    const std::vector<float> x = gaussian(static_cast<size_t>(n_tok * n_heads * p.head_dim), 11);
    const int32_t pos[] = {0, 1, 17, 300, 4095}, neg[] = {0, -1, -17, -300, -4095};
    std::vector<float> y(x.size()), back(x.size());
    ref::rope(x.data(), pos, n_tok, n_heads, p, y.data());
    ref::rope(y.data(), neg, n_tok, n_heads, p, back.data());
    EXPECT_LT(nmse(back.data(), x.data(), x.size()), 1e-12);
    for (int64_t r = 0; r < n_tok * n_heads; ++r) {
      double n_in = 0, n_out = 0;  // rotation keeps each head's norm
      for (int64_t i = 0; i < p.head_dim; ++i) {
        const size_t k = static_cast<size_t>(r * p.head_dim + i);
        n_in += double{x[k]} * x[k];
        n_out += double{y[k]} * y[k];
        if (i >= p.n_rot || r / n_heads == 0) {  // unrotated dimensions and position 0 pass through
          ASSERT_EQ(y[k], x[k]) << "row " << r << " element " << i;
        }
      }
      EXPECT_NEAR(n_out, n_in, 1e-4 * n_in);
    }
  }
}

// An independent float64 causal attention over the dequantized cache rows.
std::vector<float> naive_attention(const std::vector<float>& q, const std::vector<int32_t>& q_pos,
                                   const std::vector<float>& k, const std::vector<float>& v,
                                   const std::vector<int32_t>& kv_pos, const ref::AttentionShape& s) {
  const int64_t row = s.n_head_kv * s.head_dim;
  std::vector<float> out(q.size(), 0.0f);
  for (size_t i = 0; i < q_pos.size(); ++i)
    for (int64_t h = 0; h < s.n_head; ++h) {
      const int64_t kvh = h * s.n_head_kv / s.n_head;
      std::vector<double> w(kv_pos.size(), 0.0);
      double mx = -INFINITY, total = 0;
      for (size_t j = 0; j < kv_pos.size(); ++j) {
        if (kv_pos[j] > q_pos[i]) continue;
        double dot = 0;
        for (int64_t d = 0; d < s.head_dim; ++d)
          dot += double{q[(i * s.n_head + h) * s.head_dim + d]} * k[j * row + kvh * s.head_dim + d];
        w[j] = dot / std::sqrt(double(s.head_dim));
        mx = std::max(mx, w[j]);
      }
      for (size_t j = 0; j < kv_pos.size(); ++j) {
        w[j] = kv_pos[j] <= q_pos[i] ? std::exp(w[j] - mx) : 0.0;
        total += w[j];
      }
      for (int64_t d = 0; d < s.head_dim; ++d) {
        double acc = 0;
        for (size_t j = 0; j < kv_pos.size(); ++j) acc += w[j] * v[j * row + kvh * s.head_dim + d];
        out[(i * s.n_head + h) * s.head_dim + d] = total > 0 ? static_cast<float>(acc / total) : 0.0f;
      }
    }
  return out;
}

TEST(Reference, AttentionMatchesNaiveSoftmax) {
  const ref::AttentionShape s{6, 2, 48};  // 3 query heads per kv head; rows of 96 (q4_0 blocks fit)
  const int64_t row = s.n_head_kv * s.head_dim, n_slots = 16, n_kv = 11, n_q = 4;
  for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::Q8_0, TensorType::Q4_0}) {
    const std::vector<float> k_in = gaussian(static_cast<size_t>(n_kv * row), 21), v_in = gaussian(k_in.size(), 22);
    const std::vector<float> q = gaussian(static_cast<size_t>(n_q * s.n_head * s.head_dim), 23, 2.0f);
    // Tokens at positions 0..10 stored in scattered slots; queries at positions 10, 3, 0 and -1 (sees nothing).
    const std::vector<int32_t> slots = {9, 2, 14, 0, 5, 11, 3, 15, 7, 1, 12};
    std::vector<int32_t> kv_pos(n_kv);
    for (int64_t j = 0; j < n_kv; ++j) kv_pos[static_cast<size_t>(j)] = static_cast<int32_t>(j);
    const std::vector<int32_t> q_pos = {10, 3, 0, -1};

    const size_t row_bytes = gguf::type_bytes(t, static_cast<uint64_t>(row));
    std::vector<uint8_t> k_cache(n_slots * row_bytes, 0xAB), v_cache(k_cache.size(), 0xAB);
    ref::kv_store(t, k_in.data(), n_kv, row, slots.data(), k_cache.data());
    ref::kv_store(t, v_in.data(), n_kv, row, slots.data(), v_cache.data());
    EXPECT_EQ(k_cache[4 * row_bytes], 0xAB) << "slot 4 was not listed, must be untouched";

    // What the cache holds, row by row, in token order.
    std::vector<float> k_deq(k_in.size()), v_deq(v_in.size());
    for (int64_t j = 0; j < n_kv; ++j) {
      ref::dequantize_row(t, k_cache.data() + slots[j] * row_bytes, k_deq.data() + j * row, row);
      ref::dequantize_row(t, v_cache.data() + slots[j] * row_bytes, v_deq.data() + j * row, row);
    }
    EXPECT_LT(nmse(k_deq.data(), k_in.data(), k_in.size()), t == TensorType::Q4_0 ? 1e-2 : 1e-4);

    // Shuffle the list order: attention must not depend on it.
    std::vector<int32_t> order = {3, 7, 0, 10, 1, 5, 9, 2, 8, 4, 6}, l_slots(n_kv), l_pos(n_kv);
    for (int64_t j = 0; j < n_kv; ++j) l_slots[j] = slots[order[j]], l_pos[j] = kv_pos[order[j]];
    std::vector<float> out(q.size(), NAN);
    ref::attention(q.data(), q_pos.data(), n_q, t, k_cache.data(), v_cache.data(), l_slots.data(), l_pos.data(), n_kv, s,
                   out.data());
    const std::vector<float> want = naive_attention(q, q_pos, k_deq, v_deq, kv_pos, s);
    double max_diff = 0;
    for (size_t i = 0; i < out.size(); ++i) max_diff = std::max(max_diff, std::fabs(double{out[i]} - want[i]));
    EXPECT_LT(max_diff, 1e-5) << gguf::type_name(t);
    // Query at position 0 sees only token 0: its output is token 0's V row for the head's group.
    for (int64_t h = 0; h < s.n_head; ++h)
      for (int64_t d = 0; d < s.head_dim; ++d)
        ASSERT_NEAR(out[(2 * s.n_head + h) * s.head_dim + d], v_deq[(h / 3) * s.head_dim + d], 1e-6f);
    for (int64_t i = 3 * s.n_head * s.head_dim; i < n_q * s.n_head * s.head_dim; ++i) ASSERT_EQ(out[i], 0.0f);
  }
}

TEST(Reference, SmallOps) {
  const float x[] = {1, -2, 3, -4}, w[] = {1, 0.5f, 2, 1};
  float y[4];
  ref::rms_norm(x, w, 1, 4, 0.0f, y);  // rms = sqrt(30/4)
  const float inv = 1.0f / std::sqrt(7.5f);
  EXPECT_NEAR(y[0], 1 * inv, 1e-6f);
  EXPECT_NEAR(y[1], -1 * inv, 1e-6f);
  EXPECT_NEAR(y[2], 6 * inv, 1e-6f);
  EXPECT_NEAR(y[3], -4 * inv, 1e-6f);

  const float g[] = {0, 1, -1, 20}, u[] = {5, 2, 2, 0.5f};
  ref::swiglu(g, u, 4, y);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 2.0f / (1.0f + std::exp(-1.0f)), 1e-6f);
  EXPECT_NEAR(y[2], -2.0f / (1.0f + std::exp(1.0f)), 1e-6f);
  EXPECT_NEAR(y[3], 10.0f, 1e-5f);

  const float big[] = {1000, 1001, 999, 1001};
  ref::softmax(big, 4, y);
  const float e0 = std::exp(-1.0f), e2 = std::exp(-2.0f), sum = e0 + 2 + e2;
  EXPECT_NEAR(y[0], e0 / sum, 1e-6f);
  EXPECT_NEAR(y[1], 1 / sum, 1e-6f);
  EXPECT_NEAR(y[2], e2 / sum, 1e-6f);
  EXPECT_EQ(ref::argmax(big, 4), 1);  // first of the tied maxima

  ref::add(x, w, 4, y);
  EXPECT_EQ(y[3], -3.0f);
  ref::mul(x, w, 4, y);
  EXPECT_EQ(y[1], -1.0f);
  ref::scale(x, -0.5f, 4, y);
  EXPECT_EQ(y[2], -1.5f);
}

TEST(Reference, MatvecAndGetRowsDequantizeRows) {
  const int64_t n_rows = 5, n_cols = 512;
  const std::vector<float> w = gaussian(static_cast<size_t>(n_rows * n_cols), 31), x = gaussian(n_cols, 32);
  for (TensorType t : kAllTypes) {
    const std::vector<uint8_t> wq = quantize(t, w);
    const std::vector<float> wd = dequantize(t, wq, w.size());
    float y[2 * n_rows];
    std::vector<float> xx(x);
    xx.insert(xx.end(), x.begin(), x.end());
    ref::matmul(t, wq.data(), n_rows, n_cols, xx.data(), 2, y);
    for (int64_t r = 0; r < n_rows; ++r) {
      double want = 0;
      for (int64_t c = 0; c < n_cols; ++c) want += double{wd[r * n_cols + c]} * x[c];
      EXPECT_NEAR(y[r], want, 1e-4) << gguf::type_name(t);
      EXPECT_EQ(y[r], y[n_rows + r]);
    }
    const int32_t ids[] = {4, 0, 4};
    std::vector<float> rows(3 * n_cols);
    ref::get_rows(t, wq.data(), n_cols, ids, 3, rows.data());
    EXPECT_EQ(std::memcmp(rows.data(), wd.data() + 4 * n_cols, n_cols * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(rows.data() + n_cols, wd.data(), n_cols * sizeof(float)), 0);
  }
}

// The references composed into whole models reproduce the stored float64 computation
// (`ideal_last_logits`: the same dequantized weights, f16-rounded K/V) and pick the reference
// implementation's top token as often as that computation does.
TEST(Reference, ForwardMatchesStoredIdealLogits) {
  VKLLM_REQUIRE_SHARED("reference/index.json");
  const std::vector<uint8_t> index_text = vkllm::test::read_file(shared_path("reference/index.json"));
  const nlohmann::json index = nlohmann::json::parse(index_text.begin(), index_text.end());
  for (const char* name : {"stories260K--st-1", "synth-llama-f32--sy-1", "synth-llama-q4_k_m--sy-2",
                           "synth-llama-q2_k--sy-1", "synth-qwen2-f32--sy-1", "synth-qwen2-q8_0--sy-2"}) {
    const std::string rel = std::string("reference/") + name + ".json";
    VKLLM_REQUIRE_SHARED(rel);
    const std::vector<uint8_t> text = vkllm::test::read_file(shared_path(rel));
    const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end());
    const std::string model_rel = "models/" + j.at("model_file").get<std::string>();
    VKLLM_REQUIRE_SHARED(model_rel);
    const gguf::File model = gguf::File::open(shared_path(model_rel));
    const std::vector<int32_t> tokens = j.at("prompt_tokens").get<std::vector<int32_t>>();
    const std::vector<float> ideal = j.at("ideal_last_logits").get<std::vector<float>>();
    const int64_t n_vocab = j.at("n_vocab").get<int64_t>();

    const std::vector<float> logits = ref::forward(model, tokens, TensorType::F16);
    ASSERT_EQ(logits.size(), tokens.size() * static_cast<size_t>(n_vocab)) << name;
    const float* last = logits.data() + (tokens.size() - 1) * static_cast<size_t>(n_vocab);
    double max_diff = 0, max_abs = 0;
    for (int64_t i = 0; i < n_vocab; ++i) {
      max_diff = std::max(max_diff, std::fabs(double{last[i]} - ideal[static_cast<size_t>(i)]));
      max_abs = std::max(max_abs, std::fabs(double{ideal[static_cast<size_t>(i)]}));
    }
    size_t top1_same = 0;
    const nlohmann::json& topk = j.at("prompt_topk");
    for (size_t i = 0; i < tokens.size(); ++i)
      top1_same += ref::argmax(logits.data() + i * static_cast<size_t>(n_vocab), n_vocab) == topk[i][0][0].get<int64_t>();
    std::printf("  %-26s max |dlogit| vs ideal %.2e (logits up to %.1f), top-1 %zu/%zu\n", name, max_diff, max_abs,
                top1_same, tokens.size());
    EXPECT_LT(max_diff, 2e-3) << name;
    // As often as the ideal computation agrees with the reference implementation, give or take one.
    const double ideal_agree = index.at(name).at("ideal_top1_agreement").get<double>();
    EXPECT_GE(static_cast<double>(top1_same + 1), ideal_agree * static_cast<double>(tokens.size())) << name;
  }
}
