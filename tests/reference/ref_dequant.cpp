// Reference dequantization: one row of any supported weight type to f32, following ggml's dequantize_row_*.
#include <cstring>
#include <stdexcept>
#include <string>

#include "ref_blocks.h"
#include "ref_ops.h"

namespace vkllm::ref {

namespace {

using gguf::TensorType;

// Reads block i of a row; rows in GGUF files are not aligned for the block structs.
template <typename Block>
Block load_block(const uint8_t* src, int64_t i) {
  Block b;
  std::memcpy(&b, src + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

void dequant_q4_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = fp16_to_f32(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0f) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0f) * d + m;
      y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

// The 5th bits of a Q5 block: bit j of qh belongs to element j (j < 32).
uint32_t q5_high_bits(const uint8_t qh[4]) {
  return uint32_t{qh[0]} | uint32_t{qh[1]} << 8 | uint32_t{qh[2]} << 16 | uint32_t{qh[3]} << 24;
}

void dequant_q5_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = fp16_to_f32(b.d);
    const uint32_t qh = q5_high_bits(b.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = static_cast<int>((b.qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
      const int hi = static_cast<int>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + kQK / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequant_q5_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m);
    const uint32_t qh = q5_high_bits(b.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const uint32_t lo = (b.qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
      const uint32_t hi = (b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + kQK / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

void dequant_q8_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = fp16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

// Q2_K: each 128-element half uses 32 bytes of qs; pass `shift` (0,2,4,6) picks bit pair, and
// each pass covers two 16-element sub-blocks (bytes l and l+16), each with its own scale/min.
void dequant_q2_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ2_K>(src, i);
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    const uint8_t* q = b.qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = b.scales[is++];
          const float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[part * 16 + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// The 16 signed 6-bit scales of a Q3_K block (stored +32): low nibbles in bytes 0..7 (scales
// 0..7 low, 8..15 high nibble), top 2 bits in bytes 8..11 (scale j at byte 8 + j%4, bits 2*(j/4)).
void unpack_q3_k_scales(const uint8_t packed[12], int out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? (packed[j] & 0x0f) : (packed[j - 8] >> 4);
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (low | (high << 4)) - 32;
  }
}

// Q3_K: like Q2_K's order; the third bit comes from hmask byte (l within the 32-element group),
// bit m advancing once per 32 elements; a clear bit means "subtract 4".
void dequant_q3_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ3_K>(src, i);
    const float d_all = fp16_to_f32(b.d);
    int scales[16];
    unpack_q3_k_scales(b.scales, scales);
    const uint8_t* q = b.qs;
    int is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * static_cast<float>(scales[is++]);
          for (int l = 0; l < 16; ++l) {
            const int k = part * 16 + l;
            const int v = ((q[k] >> shift) & 3) - ((b.hmask[k] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

// Q4_K: four 64-element groups; group g uses qs[32g..32g+31], low nibbles first (sub-block 2g)
// then high nibbles (sub-block 2g+1).
void dequant_q4_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ4_K>(src, i);
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    const uint8_t* q = b.qs;
    for (int g = 0; g < 4; ++g, q += 32) {
      uint8_t sc, mn;
      get_scale_min_k4(2 * g, b.scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      get_scale_min_k4(2 * g + 1, b.scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// Q5_K: Q4_K plus a fifth bit from qh[l], bit 2g for the low-nibble half, 2g+1 for the high.
void dequant_q5_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ5_K>(src, i);
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    const uint8_t* ql = b.qs;
    for (int g = 0; g < 4; ++g, ql += 32) {
      uint8_t sc, mn;
      get_scale_min_k4(2 * g, b.scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      get_scale_min_k4(2 * g + 1, b.scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      const int u1 = 1 << (2 * g), u2 = 1 << (2 * g + 1);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

// Q6_K: two 128-element halves, each using 64 bytes of ql, 32 of qh and 8 scales. Within a
// half, element 32*k + l (k = 0..3) takes nibble k/2 of ql[l + 32*(k%2)] and bits 2k of qh[l].
void dequant_q6_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = fp16_to_f32(b.d);
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is + 0] * q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2] * q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4] * q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6] * q4);
      }
    }
  }
}

}  // namespace

void dequant_iq4_nl(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockIQ4_NL>(src, i);
    const float d = fp16_to_f32(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * kIq4Values[b.qs[j] & 0x0f];
      y[j + kQK / 2] = d * kIq4Values[b.qs[j] >> 4];
    }
  }
}

void dequant_iq4_xs(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockIQ4_XS>(src, i);
    const float d = fp16_to_f32(b.d);
    for (int ib = 0; ib < kQKK / 32; ++ib, y += 32) {
      const int ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b.scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIq4Values[b.qs[16 * ib + j] & 0x0f];
        y[j + 16] = dl * kIq4Values[b.qs[16 * ib + j] >> 4];
      }
    }
  }
}

bool is_supported(TensorType t) {
  switch (t) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16: case TensorType::Q4_0:
    case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1: case TensorType::Q8_0:
    case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K:
    case TensorType::Q6_K: case TensorType::IQ4_NL: case TensorType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

void dequantize_row(TensorType t, const uint8_t* src, float* dst, int64_t n) {
  const int64_t legacy_blocks = n / kQK, k_blocks = n / kQKK;
  switch (t) {
    case TensorType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case TensorType::F16:
    case TensorType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = t == TensorType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    case TensorType::Q4_0: dequant_q4_0(src, dst, legacy_blocks); return;
    case TensorType::Q4_1: dequant_q4_1(src, dst, legacy_blocks); return;
    case TensorType::Q5_0: dequant_q5_0(src, dst, legacy_blocks); return;
    case TensorType::Q5_1: dequant_q5_1(src, dst, legacy_blocks); return;
    case TensorType::Q8_0: dequant_q8_0(src, dst, legacy_blocks); return;
    case TensorType::Q2_K: dequant_q2_k(src, dst, k_blocks); return;
    case TensorType::Q3_K: dequant_q3_k(src, dst, k_blocks); return;
    case TensorType::Q4_K: dequant_q4_k(src, dst, k_blocks); return;
    case TensorType::Q5_K: dequant_q5_k(src, dst, k_blocks); return;
    case TensorType::Q6_K: dequant_q6_k(src, dst, k_blocks); return;
    case TensorType::IQ4_NL: dequant_iq4_nl(src, dst, legacy_blocks); return;
    case TensorType::IQ4_XS: dequant_iq4_xs(src, dst, k_blocks); return;
    default: throw std::invalid_argument("ref::dequantize_row: unsupported type " + gguf::type_name(t));
  }
}

}  // namespace vkllm::ref
