// attention_simd: the attention of attention.comp (same bindings, push constants, split-KV
// partials and causal masking) laid out for CPU drivers such as lavapipe, which run a subgroup's
// lanes as one SIMD register, turn every barrier into a coroutine switch and every non-uniform
// load into a loop over the lanes. So: no shared memory and no barriers, and as few loads as
// possible per multiply.
//
// A workgroup is one subgroup of W lanes. It owns one KV head, R query rows (row r is token r / G,
// head hk·G + r % G, G = n_head / n_head_kv) and one split of the slot list. Each lane takes every
// W-th slot: it loads the slot's K row (rotated by RoPE at the slot's position from the cos/sin
// table, as the cache holds K un-rotated) and V row once, scores all R rows held in its registers
// and folds the slot into its own running max / sum / output per row. The running max is raised
// only when a score exceeds it by more than RESCALE_AT (the result is exact for any reference
// max), so most slots cost one exp per row. At the end the lanes' partial results are merged
// with subgroup shuffles.
//
// Slots whose position is greater than the query's are masked; positions ascend along the slot
// list (the cache lists them so), so a workgroup stops at the first slot past its last query.
//
// Bindings and push constants: those of attention.comp.
// Specialization: 0 W (the subgroup size), 1 HD (head_dim, even), 2 R, 3 N_ROT, 4 NEOX.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "kv_cache.glsl"
#include "params.h"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;
layout(constant_id = 2) const uint R = 1;
layout(constant_id = 3) const uint N_ROT = 64;
layout(constant_id = 4) const bool NEOX = false;
const float NEG = -1.0e30;
const float RESCALE_AT = 8.0;  // probabilities stay below e^8 before the running max is raised

layout(binding = 0) readonly buffer Q { float q[]; };
CACHE_READER(kc, 1)
CACHE_READER(vc, 2)
layout(binding = 3) readonly buffer KvSlots { int kv_slots[]; };
layout(binding = 4) readonly buffer KvPos { int kv_pos[]; };
layout(binding = 5) readonly buffer QPos { int q_pos[]; };
layout(binding = 6) writeonly buffer Out { float out_[]; };
layout(binding = 7) writeonly buffer PartialMl { float partial_ml[]; };
layout(binding = 8) readonly buffer RopeTable { vec2 rope_table[]; };
layout(push_constant) uniform Push { AttentionParams p; };

// This head's HD elements of a cache row into dst; f16 reads two per load.
#if defined(CACHE_F16)
#define LOAD_HEAD(NAME, row_base, e0, dst)                                              \
  [[unroll]] for (uint t = 0; t < HD / 2; ++t) {                                         \
    const vec2 h = unpackHalf2x16(NAME##_u32[((row_base) + 2 * ((e0) + 2 * t)) >> 2]);  \
    dst[2 * t] = h.x;                                                                    \
    dst[2 * t + 1] = h.y;                                                                \
  }
#else
#define LOAD_HEAD(NAME, row_base, e0, dst) \
  [[unroll]] for (uint t = 0; t < HD; ++t) dst[t] = NAME##_at(row_base, (e0) + t);
#endif

void main() {
  const uint W = gl_WorkGroupSize.x, lane = gl_LocalInvocationID.x;
  const uint G = p.n_head / p.n_head_kv;
  const uint hk = gl_WorkGroupID.y;
  const uint n_rows = p.n_q * G;
  const uint r0 = gl_WorkGroupID.x * R;
  const uint split = gl_WorkGroupID.z;
  const uint kv_begin = split * p.kv_per_split;
  const uint kv_end = min(p.n_kv, kv_begin + p.kv_per_split);
  const uint row_bytes = cache_row_bytes(p.n_head_kv * HD);

  float qv[R * HD], ov[R * HD], m[R], l[R];
  int qpos[R];
  int qmax = -2147483647;
  [[unroll]] for (uint i = 0; i < R; ++i) {
    const uint r = min(r0 + i, n_rows - 1);
    const bool live = r0 + i < n_rows;
    const uint at = (r / G) * p.q_stride + (hk * G + r % G) * HD;
    [[unroll]] for (uint d = 0; d < HD; ++d) {
      qv[i * HD + d] = live ? q[at + d] * p.scale : 0.0;
      ov[i * HD + d] = 0.0;
    }
    qpos[i] = live ? q_pos[r / G] : -2147483647;
    qmax = max(qmax, qpos[i]);
    m[i] = NEG;
    l[i] = 0.0;
  }

  for (uint kv0 = kv_begin; kv0 < kv_end; kv0 += W) {
    if (kv_pos[kv0] > qmax) break;  // positions ascend: no later slot is visible to these rows
    const uint idx = min(kv0 + lane, kv_end - 1);
    const int pos = kv_pos[idx];
    const int kpos = kv0 + lane < kv_end ? pos : 2147483647;
    const uint row = uint(kv_slots[idx]) * row_bytes;
    float kx[HD], vx[HD];
    LOAD_HEAD(kc, row, hk * HD, kx)
    LOAD_HEAD(vc, row, hk * HD, vx)
    // RoPE on K at the slot's position: pairs (2i, 2i+1), or (i, i + N_ROT/2) for NeoX.
    [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i) {
      const vec2 cs = rope_table[uint(pos) * (HD / 2) + i];
      const uint d0 = NEOX ? i : 2 * i, d1 = NEOX ? i + N_ROT / 2 : 2 * i + 1;
      const float a = kx[d0], b = kx[d1];
      kx[d0] = a * cs.x - b * cs.y;
      kx[d1] = a * cs.y + b * cs.x;
    }

    [[unroll]] for (uint i = 0; i < R; ++i) {
      float s = 0.0;
      [[unroll]] for (uint d = 0; d < HD; ++d) s += qv[i * HD + d] * kx[d];
      const bool visible = kpos <= qpos[i];
      if (visible && s > m[i] + RESCALE_AT) {
        const float corr = exp(m[i] - s);
        l[i] *= corr;
        [[unroll]] for (uint d = 0; d < HD; ++d) ov[i * HD + d] *= corr;
        m[i] = s;
      }
      const float pr = visible ? exp(s - m[i]) : 0.0;
      l[i] += pr;
      [[unroll]] for (uint d = 0; d < HD; ++d) ov[i * HD + d] += pr * vx[d];
    }
  }

  // Merge the lanes' partial results.
  [[unroll]] for (uint i = 0; i < R; ++i) {
    float mx = m[i];
    [[unroll]] for (uint w = 1; w < W; w <<= 1) mx = max(mx, subgroupShuffleXor(mx, w));
    const float f = exp(m[i] - mx);
    float sum = l[i] * f;
    [[unroll]] for (uint w = 1; w < W; w <<= 1) sum += subgroupShuffleXor(sum, w);
    [[unroll]] for (uint d = 0; d < HD; ++d) {
      float o = ov[i * HD + d] * f;
      [[unroll]] for (uint w = 1; w < W; w <<= 1) o += subgroupShuffleXor(o, w);
      ov[i * HD + d] = o;
    }
    m[i] = mx;
    l[i] = sum;
  }
  if (lane != 0) return;
  [[unroll]] for (uint i = 0; i < R; ++i) {
    const uint r = r0 + i;
    if (r >= n_rows) break;
    if (p.n_split == 1) {
      const uint at = (r / G) * p.out_stride + (hk * G + r % G) * HD;
      [[unroll]] for (uint d = 0; d < HD; ++d) out_[at + d] = l[i] > 0.0 ? ov[i * HD + d] / l[i] : 0.0;
    } else {
      const uint row = split * n_rows * p.n_head_kv + hk * n_rows + r;  // [split][kv head][row]
      [[unroll]] for (uint d = 0; d < HD; ++d) out_[row * HD + d] = ov[i * HD + d];
      partial_ml[row * 2] = m[i];
      partial_ml[row * 2 + 1] = l[i];
    }
  }
}
