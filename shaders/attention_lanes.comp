// attention_lanes: the attention of attention.comp (same bindings and push constants, no split-KV)
// for short slot lists on CPU drivers: a lane per query row. attention_simd gives each lane a slot
// instead and merges the lanes' partial results at the end with subgroup shuffles, which lavapipe
// runs as scalar loops: for a list of a few dozen slots that merge and the per-row store by one
// lane cost more than the slots themselves. Here every lane walks the whole list for its own row
// (row r: token r / n_head, head r % n_head), so nothing crosses lanes and each lane stores its own
// output. All lanes take the same slot at once: its position, slot and RoPE angles are loads at
// one address for the whole subgroup; only the K and V rows differ (by KV head) from lane to lane.
//
// K is rotated as it is read (the cache holds it un-rotated), by the rope table's angles at the
// slot's position. The running max is raised only when a score exceeds it by more than RESCALE_AT
// (exact for any reference max), as in attention_simd. Slots past the workgroup's last query
// position end the walk (positions ascend along the list); with a window, those at or below a
// row's position − window are masked, and slots behind every row's window are skipped.
// Scores may be soft-capped (Gemma 2).
//
// Bindings and push constants: those of attention.comp (7, the split partials, is not read).
// Specialization: 0 W (the subgroup size), 1 HD (head_dim, a multiple of 8), 2 N_ROT, 3 NEOX, 4 SOFTCAP.
// BATCH (f16 caches): one query token of each of up to MAX_SEQ sequences, each over its own cache
// and lists (a decode step of several sequences in one dispatch; docs/server.md): grid y =
// sequence, whose q and output are row y of q and out; bindings 1 to 5 are arrays of MAX_SEQ,
// element y that sequence's; its list length is the push constants' n_kv_of[y] (p.n_q is 1).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#if defined(BATCH)
#define CACHE_TEXEL(NAME, i) NAME##_texel(i)
#endif
#include "kv_cache.glsl"
#include "params.h"
#include "softcap.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;
layout(constant_id = 2) const uint N_ROT = 64;
layout(constant_id = 3) const bool NEOX = false;
layout(constant_id = 4) const bool SOFTCAP = false;  // p.softcap > 0 (a branch lavapipe runs for every lane either way)
const float NEG = -1.0e30;
const float RESCALE_AT = 8.0;  // probabilities stay below e^8 before the running max is raised

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 6) writeonly buffer Out { float out_[]; };
// [pos][HD/2] (cos, sin), two pairs per 16-byte texel. The table, the slot list and the positions
// are read at one address in every lane inside the slot loop, which lavapipe runs as a per-lane
// loop per component for a storage buffer (through memory, a stalled store-to-load forward each)
// and as one wide load per lane for a texel buffer (docs/performance.md, "attention_lanes' tables
// as texels").
layout(binding = 8, rgba32ui) uniform readonly restrict uimageBuffer rope_tex;
#if defined(BATCH)
#if !defined(CACHE_F16)
#error "attention_lanes: BATCH reads f16 caches"
#endif
#define MAX_SEQ 4
uint seq;  // the workgroup's sequence: the arrays' element it reads
layout(binding = 1, rgba32ui) uniform readonly restrict uimageBuffer kc_of[MAX_SEQ];
layout(binding = 2, rgba32ui) uniform readonly restrict uimageBuffer vc_of[MAX_SEQ];
// The slot lists and positions as r32ui texels of their whole buffers (each sequence's list starts
// at its buffer's start), for the reason the one-sequence kernel reads them so (kv_list.glsl).
layout(binding = 3, r32ui) uniform readonly restrict uimageBuffer kv_slots_of[MAX_SEQ];
layout(binding = 4, r32ui) uniform readonly restrict uimageBuffer kv_pos_of[MAX_SEQ];
// Texel i of the sequence's element of an array of texel buffers. Such an array may be indexed only
// by a constant on some devices (lavapipe), so each element under a branch, uniform in the workgroup.
#define SEQ_TEXEL_READER(NAME, ARR)              \
  uvec4 NAME(int i) {                            \
    if (seq == 0) return imageLoad(ARR[0], i);   \
    if (seq == 1) return imageLoad(ARR[1], i);   \
    if (seq == 2) return imageLoad(ARR[2], i);   \
    return imageLoad(ARR[3], i);                 \
  }
SEQ_TEXEL_READER(kc_texel, kc_of)
SEQ_TEXEL_READER(vc_texel, vc_of)
SEQ_TEXEL_READER(kv_slot_texel, kv_slots_of)
SEQ_TEXEL_READER(kv_pos_texel, kv_pos_of)
layout(binding = 5) readonly buffer QPos { int d[]; } q_pos_of[MAX_SEQ];
#define KV_SLOT(i) kv_slot_texel(int(i)).x
#define KV_POS(i) int(kv_pos_texel(int(i)).x)
#define q_pos q_pos_of[seq].d
layout(push_constant) uniform Push { AttentionParams p; uint n_kv_of[MAX_SEQ]; };
#define N_KV n_kv_of[seq]
#define Q_ROW(t) seq  // a sequence's one query token is row `seq` of q and out
#else
layout(binding = 5) readonly buffer QPos { int q_pos[]; };
CACHE_RUN_READER(kc, 1)
CACHE_RUN_READER(vc, 2)
layout(push_constant) uniform Push { AttentionParams p; };
#include "kv_list.glsl"
#define KV_SLOT(i) kv_slot(i)
#define KV_POS(i) kv_position(i)
#define N_KV p.n_kv
#define Q_ROW(t) (t)
#endif

// The rope table's (cos, sin) of pairs 2j and 2j + 1 at position pos.
void table_pairs(uint pos, uint j, out vec2 a, out vec2 b) {
  const uvec4 w = imageLoad(rope_tex, int((pos * (HD / 2) + 2 * j) >> 1));
  a = uintBitsToFloat(w.xy);
  b = uintBitsToFloat(w.zw);
}

// RoPE on v: pairs (2i, 2i+1), or (i, i + N_ROT/2) for NeoX, by the table's angles at pos.
void rotate(inout float v[HD], uint pos) {
  [[unroll]] for (uint j = 0; j < N_ROT / 4; ++j) {
    vec2 cs[2];
    table_pairs(pos, j, cs[0], cs[1]);
    [[unroll]] for (uint k = 0; k < 2; ++k) {
      const uint pr = 2 * j + k, d0 = NEOX ? pr : 2 * pr, d1 = NEOX ? pr + N_ROT / 2 : 2 * pr + 1;
      const float a = v[d0], b = v[d1];
      v[d0] = a * cs[k].x - b * cs[k].y;
      v[d1] = a * cs[k].y + b * cs[k].x;
    }
  }
}

void main() {
#if defined(BATCH)
  seq = gl_WorkGroupID.y;
#endif
  const uint lane = gl_LocalInvocationID.x;
  const uint G = p.n_head / p.n_head_kv;
  const uint n_rows = p.n_q * p.n_head;
  const uint r_live = gl_WorkGroupID.x * gl_WorkGroupSize.x + lane;
  const bool live = r_live < n_rows;
  const uint r = min(r_live, n_rows - 1);
  const uint t = r / p.n_head, h = r % p.n_head, hk = h / G;
  const uint row_bytes = cache_row_bytes(p.n_head_kv * HD);

  const int qpos = q_pos[t];
  const int qmax = subgroupMax(live ? qpos : -2147483647);
  const int qmin = subgroupMin(live ? qpos : 2147483647);
  float qv[HD], ov[HD];
  [[unroll]] for (uint d = 0; d < HD; ++d) {
    qv[d] = q[Q_ROW(t) * p.q_stride + h * HD + d];
    ov[d] = 0.0;
  }
  rotate(qv, uint(max(qpos, 0)));  // q arrives un-rotated
  [[unroll]] for (uint d = 0; d < HD; ++d) qv[d] *= p.scale;
  float m = NEG, l = 0.0;

  for (uint i = 0; i < N_KV; ++i) {
    const int pos = KV_POS(i);
    if (pos > qmax) break;  // positions ascend: no later slot is visible to these rows
    if (p.window != 0 && pos + int(p.window) <= qmin) continue;
    const uint row = KV_SLOT(i) * row_bytes;
    float kx[HD], vx[HD];
    CACHE_LOAD_RUN(kc, row, hk * HD, HD, kx)
    rotate(kx, uint(pos));
    float s = 0.0;
    [[unroll]] for (uint d = 0; d < HD; ++d) s += qv[d] * kx[d];
    if (SOFTCAP) s = p.softcap * safe_tanh(s / p.softcap);
    const bool visible = pos <= qpos && (p.window == 0 || qpos - pos < int(p.window));
    if (visible && s > m + RESCALE_AT) {
      const float corr = exp(m - s);
      l *= corr;
      [[unroll]] for (uint d = 0; d < HD; ++d) ov[d] *= corr;
      m = s;
    }
    const float pr = visible ? exp(s - m) : 0.0;
    l += pr;
    CACHE_LOAD_RUN(vc, row, hk * HD, HD, vx)
    [[unroll]] for (uint d = 0; d < HD; ++d) ov[d] += pr * vx[d];
  }

  if (!live) return;
  const uint at = Q_ROW(t) * p.out_stride + h * HD;
  [[unroll]] for (uint d = 0; d < HD; ++d) out_[at + d] = l > 0.0 ? ov[d] / l : 0.0;
}
