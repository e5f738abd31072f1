// kv_store: converts f32 K and V rows into the cache type at their slots, K and V in one dispatch
// (grid z = 0: the row at src[t] into cache 0; z = 1: the row at src[v_offset + t] into cache 1; a
// lone store runs z = 0 only).
//   f16: one thread per element.  q8_0 / q4_0: one thread per 32-element block, quantized exactly as
//   ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref.
// Bindings: 0 src [n_tokens][src_stride] f32 (and from v_offset the V rows), 1 slots [n_tokens] i32,
// 2 cache 0, 3 cache 1, each [n_slots][row bytes].
// ROT_COPY (f16): the K rows also go, rotated by RoPE at rot[t], into the rotated copy that the CPU
// drivers' decode kernel reads (docs/kv-cache.md, "The rotated copy of K"): 4 copy [row_len / HD]
// [copy_slots][HD] f16 (head-major: a head's rows contiguous, as the decode kernel streams them),
// 5 rot [n_tokens] i32, 6 rope table [pos][HD/2] (cos, sin); specialization 1 HD,
// 2 N_ROT, 3 NEOX. The element rotated is the f16 one the cache holds, exactly as kv_rotate.comp
// rotates a cached row, so a copy rebuilt from the cache equals the one stored here bit for bit.
// BATCH (f16): one token of each of up to MAX_SEQ sequences, each into its own cache (a decode
// step of several sequences in one dispatch; docs/server.md): grid y = sequence, whose row of src is
// row y; bindings 1 to 3 (and 4, 5) are arrays of MAX_SEQ, element y that sequence's (n_tokens 1).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "kv_cache.glsl"
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer Src { float src[]; };
#if defined(BATCH)
#define MAX_SEQ 4
uint seq;  // the workgroup's sequence: the arrays' element it reads and writes
layout(binding = 1) readonly buffer Slots { int d[]; } slots_of[MAX_SEQ];
layout(binding = 2) writeonly buffer Cache0U16 { uint16_t d[]; } c0_16_of[MAX_SEQ];
layout(binding = 3) writeonly buffer Cache1U16 { uint16_t d[]; } c1_16_of[MAX_SEQ];
#define slots slots_of[seq].d
#define c0_16 c0_16_of[seq].d
#define c1_16 c1_16_of[seq].d
#else
layout(binding = 1) readonly buffer Slots { int slots[]; };
layout(binding = 2) writeonly buffer Cache0U8 { uint8_t c0_8[]; };
layout(binding = 2) writeonly buffer Cache0U16 { uint16_t c0_16[]; };
layout(binding = 3) writeonly buffer Cache1U8 { uint8_t c1_8[]; };
layout(binding = 3) writeonly buffer Cache1U16 { uint16_t c1_16[]; };
#endif
layout(push_constant) uniform Push { KvStoreParams p; };
#if defined(ROT_COPY)
#include "rope.glsl"
layout(constant_id = 1) const uint HD = 64;
layout(constant_id = 2) const uint N_ROT = 64;
layout(constant_id = 3) const bool NEOX = false;
#if defined(BATCH)
layout(binding = 4) writeonly buffer Copy { uint16_t d[]; } copy_of[MAX_SEQ];
layout(binding = 5) readonly buffer Rot { int d[]; } rot_of[MAX_SEQ];
#define copy16 copy_of[seq].d
#define rot rot_of[seq].d
#else
layout(binding = 4) writeonly buffer Copy { uint16_t copy16[]; };
layout(binding = 5) readonly buffer Rot { int rot[]; };
#endif
layout(binding = 6) readonly buffer RopeTable { vec2 rope_table[]; };
// The value an f32 element has in an f16 cache, from the bits STORE writes (rope.glsl's f16_value).
float f16_round(float x) { return f16_value(packHalf2x16(vec2(x, 0.0)) & 0xFFFFu); }
#endif

// Writes element e (f16) or block e (q8_0, q4_0) of the row at src[s] into the row at byte
// row_base of the cache viewed as C8 / C16.
#if defined(CACHE_F16)
#define STORE(C8, C16, s, row_base, e) C16[((row_base) >> 1) + (e)] = uint16_t(packHalf2x16(vec2(src[(s) + (e)], 0.0)) & 0xFFFFu);
#elif defined(CACHE_Q8_0)
#define STORE(C8, C16, s, row_base, blk)                                                 \
  {                                                                                      \
    const uint x0 = (s) + (blk) * 32;                                                    \
    float amax = 0.0;                                                                    \
    for (uint j = 0; j < 32; ++j) amax = max(amax, abs(src[x0 + j]));                    \
    const float d = amax / 127.0;                                                        \
    const float id = d != 0.0 ? 1.0 / d : 0.0;                                           \
    const uint b = (row_base) + (blk) * 34;                                              \
    C16[b >> 1] = uint16_t(packHalf2x16(vec2(d, 0.0)) & 0xFFFFu);                        \
    for (uint j = 0; j < 32; ++j) {                                                      \
      const float v = src[x0 + j] * id;                                                  \
      C8[b + 2 + j] = uint8_t(int8_t(int(sign(v) * floor(abs(v) + 0.5)))); /* half away from 0 */ \
    }                                                                                    \
  }
#else  // CACHE_Q4_0
#define STORE(C8, C16, s, row_base, blk)                                                 \
  {                                                                                      \
    const uint x0 = (s) + (blk) * 32;                                                    \
    float amax = 0.0, vmax = 0.0;                                                        \
    for (uint j = 0; j < 32; ++j) {                                                      \
      const float v = src[x0 + j];                                                       \
      if (abs(v) > amax) { amax = abs(v); vmax = v; }                                    \
    }                                                                                    \
    const float d = vmax / -8.0;                                                         \
    const float id = d != 0.0 ? 1.0 / d : 0.0;                                           \
    const uint b = (row_base) + (blk) * 18;                                              \
    C16[b >> 1] = uint16_t(packHalf2x16(vec2(d, 0.0)) & 0xFFFFu);                        \
    for (uint j = 0; j < 16; ++j) {                                                      \
      const uint lo = min(15u, uint(int(fma(src[x0 + j], id, 8.5))));                    \
      const uint hi = min(15u, uint(int(fma(src[x0 + 16 + j], id, 8.5))));               \
      C8[b + 2 + j] = uint8_t(lo | (hi << 4));                                           \
    }                                                                                    \
  }
#endif

void main() {
  const uint z = gl_WorkGroupID.z;
#if defined(BATCH)
  seq = gl_WorkGroupID.y;
  const uint t = 0, src_row = seq;  // one token per sequence
#else
  const uint t = gl_GlobalInvocationID.y, src_row = t;
#endif
  if (t >= p.n_tokens) return;
  const uint row_base = uint(slots[t]) * cache_row_bytes(p.row_len);
  const uint s = (z == 0 ? 0 : p.v_offset) + src_row * p.src_stride;
  const uint e = gl_GlobalInvocationID.x;  // element (f16) or 32-element block
#if defined(CACHE_F16)
  if (e >= p.row_len) return;
#else
  if (e * 32 >= p.row_len) return;
#endif
  if (z == 0) STORE(c0_8, c0_16, s, row_base, e)
  else STORE(c1_8, c1_16, s, row_base, e)
#if defined(ROT_COPY)
  if (z == 0) {
    const uint d = e % HD;
    uint partner, pair;
    bool first, rotated;
    rope_partner(d, N_ROT, NEOX, partner, pair, first, rotated);
    float x = f16_round(src[s + e]);
    if (rotated) x = rope_element(x, f16_round(src[s + e - d + partner]), rope_table[uint(rot[t]) * (HD / 2) + pair], first);
    copy16[rot_copy_index(e, uint(slots[t]), p.copy_slots, HD)] = uint16_t(packHalf2x16(vec2(x, 0.0)) & 0xFFFFu);
  }
#endif
}
