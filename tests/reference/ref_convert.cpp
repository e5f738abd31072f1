// Reference scalar conversions between f32 and the 16-bit float formats (IEEE half, bfloat16).
#include <bit>
#include <cmath>

#include "ref_ops.h"

namespace vkllm::ref {

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf or NaN
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN (quiet)
  if (a >= 0x47800000u) return sign | 0x7c00u;  // |f| ≥ 65536 (or inf): inf
  if (a < 0x38800000u) {                        // |f| < 2^-14: a half subnormal or zero
    if (a < 0x33000000u) return sign;           // |f| < 2^-25 rounds to zero
    const uint32_t e = a >> 23;                 // 102..112
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;             // to units of 2^-24: 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;  // may carry into the smallest normal: still right
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent (127 → 15) and round the mantissa from 23 to 10 bits; a carry
  // out of the mantissa bumps the exponent, up to 0x7c00 = inf.
  uint32_t h = (a >> 13) - ((127u - 15u) << 10);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

}  // namespace vkllm::ref
