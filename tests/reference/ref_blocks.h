// The quantized block layouts of ggml (ggml-common.h), shared by the reference (de)quantizers.
//
// `d`, `m`, `dmin` are IEEE half floats stored as raw bits. Blocks hold QK = 32 elements for the
// legacy types and QK_K = 256 ("super-blocks") for the K types. Sizes are asserted against the
// GGUF type table's block_bytes by the tests.
#pragma once
#include <cstdint>

namespace vkllm::ref {

inline constexpr int kQK = 32;    // elements per legacy block
inline constexpr int kQKK = 256;  // elements per K-type super-block

struct BlockQ4_0 {
  uint16_t d;           // scale
  uint8_t qs[kQK / 2];  // element j in the low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ4_1 {
  uint16_t d, m;        // scale, minimum: x = q * d + m
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];        // bit j (little-endian u32) = 5th bit of element j
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];  // per 16 elements: low nibble scale, high nibble min
  uint8_t qs[kQKK / 4];       // 2-bit quants, 4 per byte
  uint16_t d, dmin;           // super-block scale for scales, for mins
};
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];  // high bit of each 3-bit quant
  uint8_t qs[kQKK / 4];     // low 2 bits
  uint8_t scales[12];       // 16 6-bit scales, packed
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];       // 8 6-bit scales and 8 6-bit mins, packed (get_scale_min_k4)
  uint8_t qs[kQKK / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];     // low 4 bits
  uint8_t qh[kQKK / 4];     // high 2 bits
  int8_t scales[kQKK / 16]; // per 16 elements
  uint16_t d;
};

// IQ4_NL / IQ4_XS: each nibble indexes this non-linear codebook, scaled by the block's scale.
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];      // as Q4_0: element j low nibble of qs[j], j+16 high nibble
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;        // 2 high bits of each of the 8 sub-block scales
  uint8_t scales_l[kQKK / 64];  // 4 low bits of each (two per byte)
  uint8_t qs[kQKK / 2];     // per 32-element sub-block, 16 bytes laid out as IQ4_NL's
};
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// Scale j and min j (0..7) of a Q4_K/Q5_K block, each 6 bits, from the 12 packed bytes: the
// first four pairs sit in the low 6 bits of bytes 0..7; the last four have their low nibbles
// in bytes 8..11 and their top 2 bits in the high bits of bytes 0..7.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace vkllm::ref
