// attention_decode: the attention of query tokens over a long slot list, for CPU drivers, in
// two passes whose lanes never talk to each other inside a loop (a cross-lane operation costs
// ~400 cycles on lavapipe), each reading every K and V byte once for all G = n_head / n_head_kv
// query heads that share it (attention_simd.comp reads them once per query head).
//
// The grid's z is the query token (p.q_first + z): a decode step is one, a prefill chunk over a
// long cached prefix runs in groups of as many as the scratch holds scores for.
//
//   OP_SCORES: one lane per slot; grid x = blocks of W·p.per_lane entries, y = KV head. q of the
//     workgroup's G heads is read at uniform addresses, before the slot loop (see below). A lane
//     runs over p.per_lane consecutive entries of the slot list; it loads the slot's K row (rotated
//     by RoPE at the slot's position: angles from the rope table, advanced by one complex product
//     per position while positions are consecutive and reloaded every ANCHOR_EVERY entries) and
//     writes the G scores q_h·k (scaled, soft-capped; masked ones as NEG) of the entry side by
//     side: scores[z][head_kv][entry][GP], GP = G rounded up to a multiple of 4, so that an entry
//     is GP / 4 whole 16-byte texels (the scratch is a storage texel buffer in both passes); and
//     then the G maxima of its block of entries, as entry n_kv + block (the rows of scores are
//     n_kv + blocks long).
//     ROT_COPY (f16): K comes from the rotated copy (docs/kv-cache.md; head-major, so a lane's run
//     of slots is one stream per head), each row already rotated at kv_rot[e]; the lane rotates q
//     once, at its position plus its block's shift kv_rot − kv_pos (blocks never straddle
//     p.rot_split, where the shift changes), and runs no RoPE per entry.
//   OP_VALUES: a workgroup per DC dims of a KV head (grid x = HD / DC, y = KV head). It first
//     takes each head's maximum score M over the blocks' maxima (a lane per block, one subgroupMax
//     per head); then lane l takes entries l, l + W, …, two per iteration (l + 2iW and l + (2i+1)W,
//     so that the G·DC accumulators, on the stack, are loaded and stored once per two entries): it
//     reads each entry's G scores and DC dims of its V row and accumulates exp(s − M) and
//     exp(s − M)·v; the lanes sum once at the end through shared memory. (An online softmax, whose
//     running max is raised inside the loop, cost a third of this pass: lavapipe runs a branch's
//     body for every lane, taken or not.) Each lane load is useful (a load at the same address in
//     every lane inside a loop is a per-lane gather on lavapipe, which the first version, a lane per
//     dim, paid for the scores of every entry), and each exp serves DC dims of one entry.
//
// Bindings (both): 0 q [n_q][q_stride] f32 (un-rotated; OP_SCORES rotates it as it loads it), 1 k cache, 2 v cache, 3 kv_slots, 4 kv_pos,
// 5 q_pos [n_q], 6 out [n_q][out_stride] f32 (OP_VALUES), 7 scores (scratch), 8 rope table,
// 9 kv_rot [n_kv] i32 (ROT_COPY; binding 1 is then the rotated copy). Every one that is read per
// lane is a storage texel buffer (q, the rope table, the lists, the f16 cache, the scores).
// Push constants: AttentionParams (q_first, q_base, kv_*_base, rot_slots). Specialization: 0 W
// (subgroup size), 1 HD, 2 G, 3 N_ROT, 4 NEOX, 5 DC (divides HD; for f16 a multiple of 8),
// 6 SOFTCAP (p.softcap > 0). The entries per scores-pass lane are p.per_lane (a push constant: the
// host takes more of them for longer lists, its loop is not unrolled either way).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "kv_cache.glsl"
#include "params.h"
#include "softcap.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;
layout(constant_id = 2) const uint G = 4;
layout(constant_id = 3) const uint N_ROT = 64;
layout(constant_id = 4) const bool NEOX = false;
layout(constant_id = 5) const uint DC = 16;  // OP_VALUES: dims per workgroup
// Whether scores are soft-capped (p.softcap > 0): a constant, because lavapipe runs a branch's body
// for every lane whether taken or not, and a tanh per head and entry was ≈ 10% of the scores pass.
layout(constant_id = 6) const bool SOFTCAP = false;
const float NEG = -1.0e30;
const uint ANCHOR_EVERY = 32;
layout(push_constant) uniform Push { AttentionParams p; };

CACHE_RUN_READER(kc, 1)
CACHE_RUN_READER(vc, 2)
// The slot list and its positions as texels (kv_list.glsl; kv_rot, below, likewise): as storage
// buffers their per-lane loads were a quarter of the values pass.
#include "kv_list.glsl"
int list_position(uint e) { return kv_position(e); }
#include "window_list.glsl"
layout(binding = 5) readonly buffer QPos { int q_pos[]; };
layout(binding = 6) writeonly buffer Out { float out_[]; };
const uint GP = (G + 3) / 4 * 4;
// Binding 7, the scores: [z][head_kv][n_kv + blocks][GP] f32. The values pass reads them as texels
// of 4; the scores pass writes them as pairs of 64-bit words (the same bytes), because lavapipe
// stores a per-lane value as a loop over the lanes per component: a texel of four floats was four
// such loops per entry (≈ 20% of the pass), two 64-bit words are two.
#if defined(OP_SCORES)
layout(binding = 7) writeonly restrict buffer Scores { uint64_t scores64[]; };
#else
layout(binding = 7, rgba32ui) uniform readonly restrict uimageBuffer scores;
#endif
// Entries of a row of scores: one per slot, then one per block of p.per_lane (the block's maxima),
// and room for the one more block a split may make.
uint score_row(uint n_kv) { return n_kv + (n_kv + p.per_lane - 1) / p.per_lane + 1; }
#if defined(OP_SCORES)
// The GP scores (or block maxima) of entry e of a row of scores.
void write_scores(uint row, uint e, float sc[GP]) {
  [[unroll]] for (uint w = 0; w < GP / 2; ++w)
    scores64[(row + e) * (GP / 2) + w] = packUint2x32(floatBitsToUint(vec2(sc[2 * w], sc[2 * w + 1])));
}
#else
void read_scores(uint row, uint e, out float sc[GP]) {
  [[unroll]] for (uint w = 0; w < GP / 4; ++w) {
    const vec4 v = uintBitsToFloat(imageLoad(scores, int((row + e) * (GP / 4) + w)));
    [[unroll]] for (uint k = 0; k < 4; ++k) sc[4 * w + k] = v[k];
  }
}
#endif
// Blocks of p.per_lane entries, one per lane of the scores pass, from the query's first entry lo
// (window_list_begin: 0 without a window): those before entry p.rot_split in blocks of their own,
// then the rest (so no block straddles entry p.rot_split). A query reads entries from lo on in
// both passes, grouped from lo, so it gets the same floats whatever the list holds before lo (a
// verify pass's earlier tokens' window) or after its own entry (masked: exact zeros).
uint blocks_before_split(uint lo) { return p.rot_split > lo ? (p.rot_split - lo + p.per_lane - 1) / p.per_lane : 0; }
uint n_blocks(uint lo) {
  return blocks_before_split(lo) + (p.n_kv - max(p.rot_split, lo) + p.per_lane - 1) / p.per_lane;
}

#if defined(OP_SCORES)
// q and the rope table are read as 16-byte texels (storage texel buffers): lavapipe turns a load at
// one address in every lane into a loop over the lanes, each load of a storage buffer per
// component, each through memory, but serves a texel load as one wide load per lane. The G heads'
// q (G·HD/4 vec4) and the angles (two pairs per texel) are the pass's prologue, paid once per
// p.per_lane entries: read per component they were ≈ 30% of the pass (docs/performance.md).
layout(binding = 0, rgba32ui) uniform readonly restrict uimageBuffer q_tex;  // [n_q][q_stride] f32
layout(binding = 8, rgba32ui) uniform readonly restrict uimageBuffer rope_tex;  // [pos][HD/2] (cos, sin)
// The (cos, sin) of pair i at position pos (HD / 2 even: a position's pairs start on a texel).
vec2 rope_pair(uint pos, uint i) {
  const uvec4 w = imageLoad(rope_tex, int((pos * (HD / 2) + i) >> 1));
  return uintBitsToFloat(i % 2 == 0 ? w.xy : w.zw);
}
#if defined(ROT_COPY)
layout(binding = 9, r32ui) uniform readonly restrict uimageBuffer kv_rot_tex;  // [n_kv]: the position entry e's K row is rotated at
#endif
// RoPE on the G heads of q (held as qv) at position `at` (a macro: an array sized by
// specialization constants cannot be a function parameter).
#define ROTATE_Q(qv, at)                                                                       \
  [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i) {                                            \
    const vec2 cs = rope_pair(at, i);                                                         \
    const uint d0 = NEOX ? i : 2 * i, d1 = NEOX ? i + N_ROT / 2 : 2 * i + 1;                  \
    [[unroll]] for (uint h = 0; h < G; ++h) {                                                 \
      const float a = qv[h * (HD / 4) + d0 / 4][d0 % 4], b = qv[h * (HD / 4) + d1 / 4][d1 % 4]; \
      qv[h * (HD / 4) + d0 / 4][d0 % 4] = a * cs.x - b * cs.y;                                \
      qv[h * (HD / 4) + d1 / 4][d1 % 4] = a * cs.y + b * cs.x;                                \
    }                                                                                         \
  }

void main() {
  const uint lane = gl_LocalInvocationID.x, W = gl_WorkGroupSize.x, hk = gl_WorkGroupID.y;
  const uint row_bytes = cache_row_bytes(p.n_head_kv * HD);
  const uint z = gl_WorkGroupID.z, t = p.q_first + z;
  const int qpos = q_pos[t];
  const uint lo = window_list_begin(qpos, p.n_kv);
  const uint block = gl_WorkGroupID.x * W + lane, split_blocks = blocks_before_split(lo);
  const uint first = block < split_blocks ? lo + block * p.per_lane : max(p.rot_split, lo) + (block - split_blocks) * p.per_lane;
  const uint end = block < split_blocks ? p.rot_split : p.n_kv;
#if !defined(ROT_COPY)
  // The angles of position 1: one step between consecutive positions (a pure rotation).
  vec2 step[N_ROT / 2], ang[N_ROT / 2];
  [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i) step[i] = rope_pair(1, i) / p.attn_factor;
#endif
  // q of the G heads, loaded once before the loop (as texels: even here, at the top level, lavapipe
  // loaded the same address in every lane as a loop over the lanes). They live in registers (or the
  // stack) for the whole loop.
  vec4 qv[G * HD / 4];
  const uint q_at = p.q_base + t * (p.q_stride / 4) + hk * (G * HD / 4);
  [[unroll]] for (uint i = 0; i < G * HD / 4; ++i) qv[i] = uintBitsToFloat(imageLoad(q_tex, int(q_at + i)));
#if defined(ROT_COPY)
  // K rows are rotated at kv_rot[e]: q is rotated at its position plus the shift kv_rot[e] −
  // kv_pos[e], the same for every entry of the lane's block (0 for pinned tokens, the evictions since
  // the copy's base for the window; the blocks end at the one entry where it changes, rot_split), so
  // each score is that of q and k rotated at their positions, as without the copy.
  const int shift = first < end ? int(imageLoad(kv_rot_tex, int(p.kv_rot_base + first)).x) - kv_position(first) : 0;
  ROTATE_Q(qv, uint(max(qpos, 0) + shift))
#else
  ROTATE_Q(qv, uint(max(qpos, 0)))
#endif
  const uint row = (z * p.n_head_kv + hk) * score_row(p.n_kv);
  float mx[GP];
  [[unroll]] for (uint h = 0; h < GP; ++h) mx[h] = NEG;
#if !defined(ROT_COPY)
  int prev = -2147483647;
#endif
  // The next entry's slot and position are loaded an iteration ahead: their loads are gathers
  // whose latency the slot's K row waits for (a loop body is too long for the CPU to look ahead).
  uint slot_next = first < end ? kv_slot(first) : 0u;
  int pos_next = first < end ? kv_position(first) : 0;
  [[dont_unroll]] for (uint t = 0; t < p.per_lane; ++t) {
    const uint e = first + t;
    if (e >= end) break;
    const int pos = pos_next;
    const uint slot = slot_next;
    pos_next = kv_position(min(e + 1, end - 1));
    slot_next = kv_slot(min(e + 1, end - 1));
#if defined(ROT_COPY)
    // The copy is head-major ([n_head_kv][rot_slots][HD]): a lane's rows of this head are
    // contiguous along a run of consecutive slots (128 bytes each at head dim 64, not 1 KiB apart).
    float k[HD];
    CACHE_LOAD_RUN(kc, (hk * p.rot_slots + slot) * (HD * 2), 0, HD, k)
#else
    if (pos == prev + 1 && t % ANCHOR_EVERY != 0) {
      [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i)
        ang[i] = vec2(ang[i].x * step[i].x - ang[i].y * step[i].y, ang[i].x * step[i].y + ang[i].y * step[i].x);
    } else {
      [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i) ang[i] = rope_pair(uint(max(pos, 0)), i);
    }
    prev = pos;
    float k[HD];
    CACHE_LOAD_RUN(kc, slot * row_bytes, hk * HD, HD, k)
    [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i) {
      const uint d0 = NEOX ? i : 2 * i, d1 = NEOX ? i + N_ROT / 2 : 2 * i + 1;
      const float a = k[d0], b = k[d1];
      k[d0] = a * ang[i].x - b * ang[i].y;
      k[d1] = a * ang[i].y + b * ang[i].x;
    }
#endif
    const bool visible = pos <= qpos && (p.window == 0 || qpos - pos < int(p.window));
    float s[GP];
    [[unroll]] for (uint h = 0; h < GP; ++h) s[h] = NEG;
    // The dims outer, the heads inner: each converted element of K meets the G heads' q while it is
    // in a register. (With the heads outer, the 64 elements were spilled to the stack and reloaded
    // for every head: 282 moves in a loop of 1,751 instructions.) Each head's sum keeps its order.
    vec4 acc4[G];
    [[unroll]] for (uint h = 0; h < G; ++h) acc4[h] = vec4(0.0);
    [[unroll]] for (uint d = 0; d < HD / 4; ++d) {
      const vec4 kd = vec4(k[4 * d], k[4 * d + 1], k[4 * d + 2], k[4 * d + 3]);
      [[unroll]] for (uint h = 0; h < G; ++h) acc4[h] = fma(qv[h * (HD / 4) + d], kd, acc4[h]);
    }
    [[unroll]] for (uint h = 0; h < G; ++h) {
      float acc = (acc4[h].x + acc4[h].y) + (acc4[h].z + acc4[h].w);
      acc *= p.scale;
      if (SOFTCAP) acc = p.softcap * safe_tanh(acc / p.softcap);
      if (visible) s[h] = acc;
    }
    [[unroll]] for (uint h = 0; h < GP; ++h) mx[h] = max(mx[h], s[h]);
    write_scores(row, e, s);
  }
  if (first < end) write_scores(row, p.n_kv + block, mx);
}
#elif defined(OP_VALUES)
// The lanes' sums and outputs [G][1 + DC][W], added up at the end.
shared float part[G * (DC + 1) * gl_WorkGroupSize.x];

void main() {
  const uint lane = gl_LocalInvocationID.x, W = gl_WorkGroupSize.x, hk = gl_WorkGroupID.y;
  const uint row_bytes = cache_row_bytes(p.n_head_kv * HD);
  const uint d0 = hk * HD + gl_WorkGroupID.x * DC;
  const uint z = gl_WorkGroupID.z, t = p.q_first + z;
  const uint row = (z * p.n_head_kv + hk) * score_row(p.n_kv);
  const uint lo = window_list_begin(q_pos[t], p.n_kv);
  // Each head's maximum score, from the blocks' maxima.
  float m[G];
  [[unroll]] for (uint h = 0; h < G; ++h) m[h] = NEG;
  [[dont_unroll]] for (uint b = lane; b < n_blocks(lo); b += W) {
    float mb[GP];
    read_scores(row, p.n_kv + b, mb);
    [[unroll]] for (uint h = 0; h < G; ++h) m[h] = max(m[h], mb[h]);
  }
  [[unroll]] for (uint h = 0; h < G; ++h) m[h] = subgroupMax(m[h]);
  float l[G], o[G][DC];
  [[unroll]] for (uint h = 0; h < G; ++h) {
    l[h] = 0.0;
    [[unroll]] for (uint j = 0; j < DC; ++j) o[h][j] = 0.0;
  }
  // Two entries per iteration (e and e + W), so each accumulator, which lives on the stack (G·DC of
  // them), is loaded and stored once per two entries; a second entry past the list counts 0. The
  // dims are the outer loop of the multiply-adds, so each V value is used for the G heads right
  // after it is converted (with the heads outer the loop had 421 stack moves, now 302). The slots
  // are loaded an iteration ahead, as in the scores pass.
  uint slot_next[2] = uint[2](kv_slot(min(lo + lane, p.n_kv - 1)), kv_slot(min(lo + lane + W, p.n_kv - 1)));
  [[dont_unroll]] for (uint e = lo + lane; e < p.n_kv; e += 2 * W) {
    const uint slot[2] = slot_next;
    slot_next[0] = kv_slot(min(e + 2 * W, p.n_kv - 1));
    slot_next[1] = kv_slot(min(e + 3 * W, p.n_kv - 1));
    const bool second = e + W < p.n_kv;
    float v0[DC], v1[DC];
    CACHE_LOAD_RUN(vc, slot[0] * row_bytes, d0, DC, v0)
    CACHE_LOAD_RUN(vc, slot[1] * row_bytes, d0, DC, v1)
    float sc0[GP], sc1[GP];
    read_scores(row, e, sc0);
    read_scores(row, min(e + W, p.n_kv - 1), sc1);
    float p0[G], p1[G];
    [[unroll]] for (uint h = 0; h < G; ++h) {
      p0[h] = sc0[h] <= NEG ? 0.0 : exp(sc0[h] - m[h]);
      p1[h] = !second || sc1[h] <= NEG ? 0.0 : exp(sc1[h] - m[h]);
      l[h] += p0[h] + p1[h];
    }
    [[unroll]] for (uint j = 0; j < DC; ++j)
      [[unroll]] for (uint h = 0; h < G; ++h) o[h][j] += p0[h] * v0[j] + p1[h] * v1[j];
  }
  // Sum across the lanes in straight-line code whose shared loads are at uniform addresses (one
  // load and a broadcast each on lavapipe); lane j % W writes output dim j.
  [[unroll]] for (uint h = 0; h < G; ++h) {
    part[(h * (DC + 1)) * W + lane] = l[h];
    [[unroll]] for (uint j = 0; j < DC; ++j) part[(h * (DC + 1) + 1 + j) * W + lane] = o[h][j];
  }
  barrier();
  [[unroll]] for (uint h = 0; h < G; ++h) {
    float sum = 0.0;
    [[unroll]] for (uint w = 0; w < W; ++w) sum += part[(h * (DC + 1)) * W + w];
    [[unroll]] for (uint j = 0; j < DC; ++j) {
      float acc = 0.0;
      [[unroll]] for (uint w = 0; w < W; ++w) acc += part[(h * (DC + 1) + 1 + j) * W + w];
      if (j % W == lane) out_[t * p.out_stride + (hk * G + h) * HD + gl_WorkGroupID.x * DC + j] = sum > 0.0 ? acc / sum : 0.0;
    }
  }
}
#else
#error "attention_decode: define OP_SCORES or OP_VALUES"
#endif
