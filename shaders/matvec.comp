// matvec: y[dest(r, t)] (+)= W[r] · x[t] for activation vector t = the workgroup's z
// (decode on GPUs: one; the server's step of several sequences: one per sequence, each computed
// exactly as it would be alone). A workgroup handles ROWS consecutive rows; each subgroup takes a
// row at a time, its invocations stride over the row's units, and one subgroupAdd reduces it — no
// shared memory, no barrier. Correct for any actual subgroup count (rows are strided by
// gl_NumSubgroups).
//
// A unit is what one invocation reads at a time, each weight byte once, with 16- or 32-bit loads,
// and x as vec4 where the host says x is 16-byte aligned (X_VEC4):
//   - the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): one block, its scale
//     applied once (offsets and mins through the block's sum of x); neighbouring invocations read
//     neighbouring blocks;
//   - Q4_K: 64 elements, the two sub-blocks whose nibbles share 32 bytes;
//   - the other types: 8 consecutive elements through dequant.glsl's dq8.
// Where rows go, and the gated activation of a fused gate|up projection (each row then done for
// its gate row and its up row): common/matmul_out.glsl.
// Bindings: 0 W [rows][row_bytes] (weight type), 1 x [n_tokens][x_stride] f32, 2 y f32.
// Specialization: 0 workgroup size, 1 ROWS (rows per workgroup; the host uses size / subgroup
// size), 2 X_VEC4 (x's binding offset and x_stride allow vec4 loads).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#define WEIGHT_BINDING 0
#include "dequant.glsl"
#include "params.h"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 8;
layout(constant_id = 2) const bool X_VEC4 = false;
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { MatmulParams p; };
#include "matmul_out.glsl"

#if defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1) || defined(WTYPE_Q8_0) || \
    defined(WTYPE_IQ4_NL)
#define UNIT 32
#elif defined(WTYPE_Q4_K)
#define UNIT 64
#else
#define UNIT 8
#endif

// x[at … at+3] (at a multiple of 4).
vec4 xv(uint at) { return X_VEC4 ? x4[at >> 2] : vec4(x[at], x[at + 1], x[at + 2], x[at + 3]); }
// The 4 bytes at byte o, o a multiple of 4, from one 32-bit load (dequant.glsl's word_at takes
// two 16-bit loads for an even o).
uint w1x32(uint o) { return floatBitsToUint(w32[o >> 2]); }
// The four bytes (or nibbles at bit `sh`, masked to `mask`) of word q, as floats.
vec4 bytes_of(uint q, uint sh, uint mask) { return vec4((uvec4(q) >> (uvec4(0, 8, 16, 24) + sh)) & mask); }
vec4 i8_of(uint q) { return vec4((ivec4(q) << ivec4(24, 16, 8, 0)) >> 24); }
float sum4(vec4 v) { return (v.x + v.y) + (v.z + v.w); }
#if defined(WTYPE_IQ4_NL)
vec4 iq4_of(uint q, uint sh) {
  const uvec4 n = (uvec4(q) >> (uvec4(0, 8, 16, 24) + sh)) & 0xFu;
  return vec4(KVALUES_IQ4[n.x], KVALUES_IQ4[n.y], KVALUES_IQ4[n.z], KVALUES_IQ4[n.w]);
}
#endif

// The unit of the row at byte row_base that starts at element k, times x from element x_at + k.
float unit_dot(uint row_base, uint k, uint x_at) {
  const uint xa = x_at + k;
#if UNIT == 32
  const uint base = row_base + (k / 32) * BLOCK_BYTES;
  const float d = wf16(base);
  vec4 s = vec4(0.0), sx = vec4(0.0);
#if defined(WTYPE_Q8_0)
  [[unroll]] for (uint i = 0; i < 8; ++i) s += i8_of(word_at(base + 2 + 4 * i)) * xv(xa + 4 * i);
  return d * sum4(s);
#else
  // Elements 4i … 4i+3 are the low nibbles of qs bytes 4i … 4i+3, elements 16+4i … the high ones.
#if defined(WTYPE_Q4_0) || defined(WTYPE_IQ4_NL)
  const uint qs = base + 2;
#elif defined(WTYPE_Q4_1)
  const uint qs = base + 4;
#elif defined(WTYPE_Q5_0)
  const uint qh = word_at(base + 2), qs = base + 6;
#else  // Q5_1
  const uint qh = w1x32(base + 4), qs = base + 8;
#endif
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const uint q = (qs & 3u) == 0 ? w1x32(qs + 4 * i) : word_at(qs + 4 * i);
    const vec4 xl = xv(xa + 4 * i), xh = xv(xa + 16 + 4 * i);
#if defined(WTYPE_IQ4_NL)
    s += iq4_of(q, 0) * xl + iq4_of(q, 4) * xh;
#else
    vec4 lo = bytes_of(q, 0, 0xFu), hi = bytes_of(q, 4, 0xFu);
#if defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
    lo += 16.0 * vec4((uvec4(qh) >> (uvec4(0, 1, 2, 3) + 4 * i)) & 1u);
    hi += 16.0 * vec4((uvec4(qh) >> (uvec4(16, 17, 18, 19) + 4 * i)) & 1u);
#endif
    s += lo * xl + hi * xh;
    sx += xl + xh;
#endif
  }
#if defined(WTYPE_IQ4_NL)
  return d * sum4(s);
#elif defined(WTYPE_Q4_0)
  return d * (sum4(s) - 8.0 * sum4(sx));
#elif defined(WTYPE_Q5_0)
  return d * (sum4(s) - 16.0 * sum4(sx));
#else  // Q4_1, Q5_1: q·d + m
  return d * sum4(s) + wf16(base + 2) * sum4(sx);
#endif
#endif
#elif UNIT == 64
  // Q4_K: chunk c of the super-block, sub-blocks 2c (low nibbles) and 2c+1 (high) of qs[32c …].
  const uint base = row_base + (k / 256) * BLOCK_BYTES, c = (k % 256) / 64;
  float sc0, mn0, sc1, mn1;
  scale_min_k4(base + 4, 2 * c, sc0, mn0);
  scale_min_k4(base + 4, 2 * c + 1, sc1, mn1);
  vec4 s0 = vec4(0.0), s1 = vec4(0.0), x0 = vec4(0.0), x1 = vec4(0.0);
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    const uint q = w1x32(base + 16 + 32 * c + 4 * i);
    const vec4 xl = xv(xa + 4 * i), xh = xv(xa + 32 + 4 * i);
    s0 += bytes_of(q, 0, 0xFu) * xl;
    s1 += bytes_of(q, 4, 0xFu) * xh;
    x0 += xl;
    x1 += xh;
  }
  const float d = wf16(base), dmin = wf16(base + 2);
  return d * (sc0 * sum4(s0) + sc1 * sum4(s1)) - dmin * (mn0 * sum4(x0) + mn1 * sum4(x1));
#else
  uint base, j8;
  dq_offsets(row_base, k, base, j8);
  float v[8];
  dq8(base, j8, min(8u, p.cols - k), v);
  float acc = 0.0;
  for (uint i = 0; i < 8 && k + i < p.cols; ++i) acc += v[i] * x[xa + i];
  return acc;
#endif
}

void main() {
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint first = wg * ROWS;
  const uint t = gl_WorkGroupID.z, x_at = t * p.x_stride;
  const uint halves = p.glu != 0u ? 2 : 1;
  for (uint r = first + gl_SubgroupID; r < min(first + ROWS, p.rows); r += gl_NumSubgroups) {
    float total = 0.0, gate = 0.0;
    for (uint h = 0; h < halves; ++h) {
      const uint row_base = (r + h * p.rows) * p.row_bytes;
      float acc = 0.0;
      for (uint k = gl_SubgroupInvocationID * UNIT; k < p.cols; k += gl_SubgroupSize * UNIT) acc += unit_dot(row_base, k, x_at);
      total = subgroupAdd(acc);
      if (h == 0) gate = total;
    }
    if (subgroupElect()) {
      const uint at = matmul_dest(r, t);
      y[at] = matmul_store_value(halves == 2 ? glu_apply(gate, total) : total, y[at]);
    }
  }
}
