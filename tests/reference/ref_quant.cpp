// Reference quantization: f32 rows to every supported weight type (ggml's *_ref for the legacy types).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "ref_blocks.h"
#include "ref_ops.h"

namespace vkllm::ref {

namespace {

using gguf::TensorType;

// The legacy quantizers round with `(int)(x * id + offset)` like ggml's *_ref code, computed as
// one fused multiply-add: ggml's x86 builds contract that expression (GCC's default
// -ffp-contract=fast), and llama-quantize's files differ from the unfused result on ties.

template <typename Block>
void store_block(const Block& b, uint8_t* dst, int64_t i) {
  std::memcpy(dst + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
}

// The element of largest magnitude (the first on ties), keeping its sign.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, v = 0.0f;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      v = x[j];
    }
  return v;
}

void quant_q4_1(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQK; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    const float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_1 b{f32_to_fp16(d), f32_to_fp16(lo), {}};
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(std::fma(x[j] - lo, id, 0.5f))));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(std::fma(x[j + kQK / 2] - lo, id, 0.5f))));
      b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    store_block(b, dst, i);
  }
}

// Packs 32 five-bit values (element j, j+16 share qs[j]) into a Q5 block's qs and qh.
template <typename Block>
void pack_q5(const int q[kQK], Block* b) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    b->qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + kQK / 2] & 0x0f) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + kQK / 2] >> 4) & 1) << (j + 16);
  }
  for (int k = 0; k < 4; ++k) b->qh[k] = static_cast<uint8_t>(qh >> (8 * k));
}

void quant_q5_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x, kQK) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(std::fma(x[j], id, 16.5f))));
    BlockQ5_0 b{f32_to_fp16(d), {}, {}};
    pack_q5(q, &b);
    store_block(b, dst, i);
  }
}

void quant_q5_1(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQK; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    const float d = (hi - lo) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = static_cast<uint8_t>(std::fma(x[j] - lo, id, 0.5f));
    BlockQ5_1 b{f32_to_fp16(d), f32_to_fp16(lo), {}, {}};
    pack_q5(q, &b);
    store_block(b, dst, i);
  }
}

int clamp_round(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::lround(v)), lo, hi); }

// Scales and mins for asymmetric K types (Q2_K, Q4_K, Q5_K): x ≈ d*sc[s]*q - dmin*mn[s] with
// q in [0, q_max], sc and mn in [0, sc_max]. Each sub-block of `sub` elements spans
// [min(0, min x), max x]. Fills d, dmin (rounded to f16) and the integer q of every element.
struct AsymQuant {
  uint16_t d = 0, dmin = 0;
  int sc[16] = {}, mn[16] = {};
  int q[kQKK] = {};
};

AsymQuant quant_asym(const float* x, int sub, int q_max, int sc_max) {
  const int n_sub = kQKK / sub;
  float scale[16], minv[16], max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < n_sub; ++s) {
    float lo = 0.0f, hi = x[s * sub];
    for (int l = 0; l < sub; ++l) lo = std::min(lo, x[s * sub + l]), hi = std::max(hi, x[s * sub + l]);
    scale[s] = (hi - lo) / static_cast<float>(q_max);
    minv[s] = -lo;
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, minv[s]);
  }
  AsymQuant r;
  r.d = f32_to_fp16(max_scale / static_cast<float>(sc_max));
  r.dmin = f32_to_fp16(max_min / static_cast<float>(sc_max));
  const float d = fp16_to_f32(r.d), dmin = fp16_to_f32(r.dmin);
  for (int s = 0; s < n_sub; ++s) {
    r.sc[s] = d > 0.0f ? clamp_round(scale[s] / d, 0, sc_max) : 0;
    r.mn[s] = dmin > 0.0f ? clamp_round(minv[s] / dmin, 0, sc_max) : 0;
    const float dl = d * static_cast<float>(r.sc[s]), ml = dmin * static_cast<float>(r.mn[s]);
    for (int l = 0; l < sub; ++l)
      r.q[s * sub + l] = dl > 0.0f ? clamp_round((x[s * sub + l] + ml) / dl, 0, q_max) : 0;
  }
  return r;
}

// Scales for symmetric K types (Q3_K, Q6_K): x ≈ d*sc[s]*q with q in [-q_neg, q_neg-1] and sc in
// [-sc_lim, sc_lim-1]; each 16-element sub-block maps its largest-magnitude element to -q_neg.
struct SymQuant {
  uint16_t d = 0;
  int sc[16] = {};
  int q[kQKK] = {};
};

SymQuant quant_sym(const float* x, int q_neg, int sc_lim) {
  float scale[16], max_scale = 0.0f;
  for (int s = 0; s < 16; ++s) {
    scale[s] = signed_absmax(x + 16 * s, 16) / static_cast<float>(-q_neg);
    max_scale = std::max(max_scale, std::fabs(scale[s]));
  }
  SymQuant r;
  r.d = f32_to_fp16(max_scale / static_cast<float>(sc_lim - 1));
  const float d = fp16_to_f32(r.d);
  for (int s = 0; s < 16; ++s) {
    r.sc[s] = d > 0.0f ? clamp_round(scale[s] / d, -sc_lim, sc_lim - 1) : 0;
    const float dl = d * static_cast<float>(r.sc[s]);
    for (int l = 0; l < 16; ++l)
      r.q[16 * s + l] = dl != 0.0f ? clamp_round(x[16 * s + l] / dl, -q_neg, q_neg - 1) : 0;
  }
  return r;
}

void quant_q2_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    const AsymQuant a = quant_asym(x, 16, 3, 15);
    BlockQ2_K b{};
    b.d = a.d;
    b.dmin = a.dmin;
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<uint8_t>(a.sc[s] | (a.mn[s] << 4));
    // Element e: half e/128, bit pair (e%128)/32, byte (e%32) of that half's 32 bytes.
    for (int e = 0; e < kQKK; ++e) b.qs[(e / 128) * 32 + e % 32] |= static_cast<uint8_t>(a.q[e] << (2 * ((e % 128) / 32)));
    store_block(b, dst, i);
  }
}

void quant_q3_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    const SymQuant a = quant_sym(x, 4, 32);
    BlockQ3_K b{};
    b.d = a.d;
    for (int j = 0; j < 16; ++j) {  // inverse of unpack_q3_k_scales
      const int v = a.sc[j] + 32;
      if (j < 8) b.scales[j] |= static_cast<uint8_t>(v & 0x0f);
      else b.scales[j - 8] |= static_cast<uint8_t>((v & 0x0f) << 4);
      b.scales[8 + j % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (j / 4)));
    }
    for (int e = 0; e < kQKK; ++e) {
      const int u = a.q[e] + 4, half = e / 128, pass = (e % 128) / 32, k = e % 32;
      b.qs[half * 32 + k] |= static_cast<uint8_t>((u & 3) << (2 * pass));
      b.hmask[k] |= static_cast<uint8_t>((u >> 2) << (4 * half + pass));
    }
    store_block(b, dst, i);
  }
}

// The 12 packed scale/min bytes of Q4_K/Q5_K; inverse of get_scale_min_k4.
void pack_scale_min_k4(const int sc[8], const int mn[8], uint8_t out[12]) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      out[j] |= static_cast<uint8_t>(sc[j]);
      out[j + 4] |= static_cast<uint8_t>(mn[j]);
    } else {
      out[j + 4] = static_cast<uint8_t>((sc[j] & 0x0f) | ((mn[j] & 0x0f) << 4));
      out[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      out[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
    }
  }
}

void quant_q4_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    const AsymQuant a = quant_asym(x, 32, 15, 63);
    BlockQ4_K b{};
    b.d = a.d;
    b.dmin = a.dmin;
    pack_scale_min_k4(a.sc, a.mn, b.scales);
    for (int e = 0; e < kQKK; ++e) {
      const int g = e / 64, r = e % 64;
      b.qs[32 * g + r % 32] |= static_cast<uint8_t>(a.q[e] << (r < 32 ? 0 : 4));
    }
    store_block(b, dst, i);
  }
}

void quant_q5_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    const AsymQuant a = quant_asym(x, 32, 31, 63);
    BlockQ5_K b{};
    b.d = a.d;
    b.dmin = a.dmin;
    pack_scale_min_k4(a.sc, a.mn, b.scales);
    for (int e = 0; e < kQKK; ++e) {
      const int g = e / 64, r = e % 64, upper = r < 32 ? 0 : 1;
      b.qs[32 * g + r % 32] |= static_cast<uint8_t>((a.q[e] & 0x0f) << (4 * upper));
      b.qh[r % 32] |= static_cast<uint8_t>((a.q[e] >> 4) << (2 * g + upper));
    }
    store_block(b, dst, i);
  }
}

void quant_q6_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    const SymQuant a = quant_sym(x, 32, 128);
    BlockQ6_K b{};
    b.d = a.d;
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(a.sc[s]);
    // Element e: half e/128; within it, quarter k = (e%128)/32 and lane l = e%32 (see dequant).
    for (int e = 0; e < kQKK; ++e) {
      const int u = a.q[e] + 32, half = e / 128, k = (e % 128) / 32, l = e % 32;
      b.ql[64 * half + l + 32 * (k % 2)] |= static_cast<uint8_t>((u & 0x0f) << (4 * (k / 2)));
      b.qh[32 * half + l] |= static_cast<uint8_t>((u >> 4) << (2 * k));
    }
    store_block(b, dst, i);
  }
}

}  // namespace

void quantize_row_q8_0(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b{f32_to_fp16(d), {}};
    for (int j = 0; j < kQK; ++j) b.qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
    store_block(b, dst, i);
  }
}

void quantize_row_q4_0(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    // The largest-magnitude element maps to -8, so the full range [-8, 7] is used.
    const float d = signed_absmax(x, kQK) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 b{f32_to_fp16(d), {}};
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(std::fma(x[j], id, 8.5f))));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(std::fma(x[j + kQK / 2], id, 8.5f))));
      b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    store_block(b, dst, i);
  }
}

namespace {

// The codebook entry nearest to v.
uint8_t nearest_iq4(float v) {
  int best = 0;
  for (int k = 1; k < 16; ++k)
    if (std::fabs(v - kIq4Values[k]) < std::fabs(v - kIq4Values[best])) best = k;
  return static_cast<uint8_t>(best);
}

// Scale of a run of 32 values for the IQ4 codebook: the largest-magnitude value maps to -127, then
// one least-squares refit of the scale to the chosen entries.
float iq4_scale(const float* x) {
  const float d0 = signed_absmax(x, 32) / -127.0f;
  if (d0 == 0.0f) return 0.0f;
  double xv = 0.0, vv = 0.0;
  for (int j = 0; j < 32; ++j) {
    const float v = kIq4Values[nearest_iq4(x[j] / d0)];
    xv += double(x[j]) * v;
    vv += double(v) * v;
  }
  return vv > 0.0 ? static_cast<float>(xv / vv) : d0;
}

// 32 values at scale d as IQ4 nibbles, laid out as Q4_0's.
void iq4_nibbles(const float* x, float d, uint8_t* qs) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>(nearest_iq4(x[j] * id) | (nearest_iq4(x[j + 16] * id) << 4));
}

void quant_iq4_nl(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    BlockIQ4_NL b{f32_to_fp16(iq4_scale(x)), {}};
    iq4_nibbles(x, fp16_to_f32(b.d), b.qs);
    store_block(b, dst, i);
  }
}

// Each 32-value sub-block's scale, as a 6-bit signed multiple (−32 … 31) of the super-block's d.
void quant_iq4_xs(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    float scales[8], max_scale = 0.0f;
    for (int ib = 0; ib < 8; ++ib) {
      scales[ib] = iq4_scale(x + 32 * ib);
      if (std::fabs(scales[ib]) > std::fabs(max_scale)) max_scale = scales[ib];
    }
    BlockIQ4_XS b{f32_to_fp16(max_scale / -32.0f), 0, {}, {}};
    const float d = fp16_to_f32(b.d), id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = std::clamp(static_cast<int>(std::lround(scales[ib] * id)), -32, 31) + 32;
      b.scales_l[ib / 2] = static_cast<uint8_t>(b.scales_l[ib / 2] | ((ls & 0xf) << (4 * (ib % 2))));
      b.scales_h = static_cast<uint16_t>(b.scales_h | ((ls >> 4) << (2 * ib)));
      iq4_nibbles(x + 32 * ib, d * static_cast<float>(ls - 32), b.qs + 16 * ib);
    }
    store_block(b, dst, i);
  }
}

}  // namespace

void quantize_row(TensorType t, const float* src, uint8_t* dst, int64_t n) {
  const int64_t legacy_blocks = n / kQK, k_blocks = n / kQKK;
  switch (t) {
    case TensorType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case TensorType::F16:
    case TensorType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = t == TensorType::F16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case TensorType::Q4_0: quantize_row_q4_0(src, dst, n); return;
    case TensorType::Q4_1: quant_q4_1(src, dst, legacy_blocks); return;
    case TensorType::Q5_0: quant_q5_0(src, dst, legacy_blocks); return;
    case TensorType::Q5_1: quant_q5_1(src, dst, legacy_blocks); return;
    case TensorType::Q8_0: quantize_row_q8_0(src, dst, n); return;
    case TensorType::Q2_K: quant_q2_k(src, dst, k_blocks); return;
    case TensorType::Q3_K: quant_q3_k(src, dst, k_blocks); return;
    case TensorType::Q4_K: quant_q4_k(src, dst, k_blocks); return;
    case TensorType::Q5_K: quant_q5_k(src, dst, k_blocks); return;
    case TensorType::Q6_K: quant_q6_k(src, dst, k_blocks); return;
    case TensorType::IQ4_NL: quant_iq4_nl(src, dst, legacy_blocks); return;
    case TensorType::IQ4_XS: quant_iq4_xs(src, dst, k_blocks); return;
    default: throw std::invalid_argument("ref::quantize_row: unsupported type " + gguf::type_name(t));
  }
}

}  // namespace vkllm::ref
