// kv_store: converts f32 K or V rows into the cache type at their slots.
//   f16: one thread per element.  q8_0 / q4_0: one thread per 32-element block, quantized exactly as
//   ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref.
// Bindings: 0 src [n_tokens][src_stride] f32, 1 slots [n_tokens] i32, 2 cache [n_slots][row bytes].
#version 450
#extension GL_GOOGLE_include_directive : require
#include "kv_cache.glsl"
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer Src { float src[]; };
layout(binding = 1) readonly buffer Slots { int slots[]; };
layout(binding = 2) writeonly buffer CacheU8 { uint8_t c8[]; };
layout(binding = 2) writeonly buffer CacheU16 { uint16_t c16[]; };
layout(push_constant) uniform Push { KvStoreParams p; };

void main() {
  const uint t = gl_GlobalInvocationID.y;
  if (t >= p.n_tokens) return;
  const uint row_base = uint(slots[t]) * cache_row_bytes(p.row_len);
  const uint s = t * p.src_stride;
#if defined(CACHE_F16)
  const uint e = gl_GlobalInvocationID.x;
  if (e >= p.row_len) return;
  c16[(row_base >> 1) + e] = uint16_t(packHalf2x16(vec2(src[s + e], 0.0)) & 0xFFFFu);
#else
  const uint blk = gl_GlobalInvocationID.x;
  if (blk * 32 >= p.row_len) return;
  const uint x0 = s + blk * 32;
#if defined(CACHE_Q8_0)
  float amax = 0.0;
  for (uint j = 0; j < 32; ++j) amax = max(amax, abs(src[x0 + j]));
  const float d = amax / 127.0;
  const float id = d != 0.0 ? 1.0 / d : 0.0;
  const uint b = row_base + blk * 34;
  c16[b >> 1] = uint16_t(packHalf2x16(vec2(d, 0.0)) & 0xFFFFu);
  for (uint j = 0; j < 32; ++j) {
    const float v = src[x0 + j] * id;
    c8[b + 2 + j] = uint8_t(int8_t(int(sign(v) * floor(abs(v) + 0.5))));  // round half away from zero
  }
#else  // CACHE_Q4_0
  float amax = 0.0, vmax = 0.0;
  for (uint j = 0; j < 32; ++j) {
    const float v = src[x0 + j];
    if (abs(v) > amax) { amax = abs(v); vmax = v; }
  }
  const float d = vmax / -8.0;
  const float id = d != 0.0 ? 1.0 / d : 0.0;
  const uint b = row_base + blk * 18;
  c16[b >> 1] = uint16_t(packHalf2x16(vec2(d, 0.0)) & 0xFFFFu);
  for (uint j = 0; j < 16; ++j) {
    const uint lo = min(15u, uint(int(fma(src[x0 + j], id, 8.5))));
    const uint hi = min(15u, uint(int(fma(src[x0 + 16 + j], id, 8.5))));
    c8[b + 2 + j] = uint8_t(lo | (hi << 4));
  }
#endif
#endif
}
