// attention: causal grouped-query attention over cache slots listed in a buffer, with online
// softmax (no n×n score matrix) — flash-attention style.
//
// A workgroup owns one KV head, a tile of BQ query rows (a decode step's G rows: a tile of their
// own size, the host's choice) and one split of the slot list. Query row
// r is (token r / G, head hk·G + r % G) with G = n_head / n_head_kv, so the query heads that share a
// KV head share every K/V load. For each tile of BKV slots it loads K (rotated by RoPE at the
// slot's position as it is read, from the cos/sin table of rope_table.comp: the cache holds K
// un-rotated) and V into shared memory, scores
// them, and folds them into running max / sum / output accumulators. Slots whose position is
// greater than the query's are masked (causal), and with a window those at or below the query's
// position − window, so a ring buffer in any order works. Scores may be soft-capped (Gemma 2).
//
// With n_split > 1 (long contexts, few queries: decode) each split writes its unnormalised output
// and (max, sum) to scratch and attention_combine.comp merges them. With p.alone, each query token
// gets what it gets in a pass of its own (common/attention_alone.glsl).
//
// Bindings: 0 q [n_q][q_stride] f32 (un-rotated: each query row is rotated as it is loaded), 1 k cache, 2 v cache ([n_slots][row bytes] in the
// cache type), 3 kv_slots [n_kv] i32, 4 kv_pos [n_kv] i32, 5 q_pos [n_q] i32,
// 6 partial_o [n_split][n_head_kv][n_q·G][HD] f32, 7 partial_ml [n_split][n_head_kv][n_q·G][2] f32
// (with p.alone [token][split][n_head_kv][G]; unused where no list is split), 8 rope table
// [positions][HD/2] vec2 (cos, sin), 9 out [n_q][out_stride] f32 (rows whose list takes one split).
// Specialization: 0 workgroup size, 1 HD (head_dim), 2 BQ, 3 BKV.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "kv_cache.glsl"
#include "params.h"
#include "rope.glsl"  // rope_pair
#include "softcap.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;
layout(constant_id = 2) const uint BQ = 16;
layout(constant_id = 3) const uint BKV = 16;
const uint ACC_MAX = 32;  // accumulators per thread: BQ·HD ≤ workgroup size · ACC_MAX (host checks)
// Each thread's share of a tile's K pairs, V elements and scores: constant trip counts, so that the
// loops unroll and a thread's loads of a tile are all in flight at once (a loop whose bound depends
// on the thread issues them one iteration after another, each waiting on its slot's row address).
const uint WGS = gl_WorkGroupSize.x;
const uint K_ITERS = (BKV * (HD / 2) + WGS - 1) / WGS, V_ITERS = (BKV * HD + WGS - 1) / WGS;
const uint S_ITERS = (BQ * BKV + WGS - 1) / WGS, N_ACC = (BQ * HD + WGS - 1) / WGS;
// (Where the workgroup divides the work, as the host's tiles do, no thread's share needs a bound test.)
const bool K_EXACT = BKV * (HD / 2) % WGS == 0, V_EXACT = BKV * HD % WGS == 0, S_EXACT = BQ * BKV % WGS == 0;
const float NEG = -1.0e30;

layout(binding = 0) readonly buffer Q { float q[]; };
CACHE_READER(kc, 1)
CACHE_READER(vc, 2)
layout(binding = 3) readonly buffer KvSlots { int kv_slots[]; };
layout(binding = 4) readonly buffer KvPos { int kv_pos[]; };
layout(binding = 5) readonly buffer QPos { int q_pos[]; };
layout(binding = 6) writeonly buffer PartialO { float partial_o[]; };
layout(binding = 7) writeonly buffer PartialMl { float partial_ml[]; };
layout(binding = 8) readonly buffer RopeTable { vec2 rope_table[]; };
layout(binding = 9) writeonly buffer Out { float out_[]; };
layout(push_constant) uniform Push { AttentionParams p; };
#include "attention_alone.glsl"

shared float qs[BQ * HD];   // query rows, pre-scaled
const uint KS = HD + 1;     // K tile row stride: the scores read K rows j = 0, 1, … at once, and
                            // HD floats apart they would share one bank
shared float ks[BKV * KS];  // K tile, rotated
shared float vs[BKV * HD];  // V tile
shared float ss[BQ * BKV];  // scores, then probabilities
shared int s_qpos[BQ];
shared int s_kpos[BKV];
shared float s_m[BQ], s_l[BQ], s_corr[BQ];

void main() {
  const uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  const uint G = p.n_head / p.n_head_kv;
  const uint hk = gl_WorkGroupID.y;
  const AttentionPart part = attention_part(gl_WorkGroupID.z, G);
  if (!part.live) return;
  const uint n_rows = part.n_q * G;
  const uint r0 = gl_WorkGroupID.x * BQ;
  const uint kv_begin = part.kv_begin, kv_end = part.kv_end;
  const uint row_bytes = cache_row_bytes(p.n_head_kv * HD);

  // Query rows rotated by RoPE at their token's position (q arrives un-rotated), then scaled.
  for (uint e = tid; e < BQ * HD; e += wg) {
    const uint i = e / HD, d = e % HD, r = r0 + i;
    float v = 0.0;
    if (r < n_rows) {
      const uint at = (part.q0 + r / G) * p.q_stride + (hk * G + r % G) * HD;
      v = q[at + d];
      uint partner, pair;
      bool first, rotated;
      rope_partner(d, p.n_rot, p.neox != 0, partner, pair, first, rotated);
      if (rotated) v = rope_element(v, q[at + partner], rope_table[uint(max(q_pos[part.q0 + r / G], 0)) * (HD / 2) + pair], first);
      v *= p.scale;
    }
    qs[e] = v;
  }
  if (tid < BQ) {
    const uint r = r0 + tid;
    s_qpos[tid] = r < n_rows ? q_pos[part.q0 + r / G] : -2147483647;
    s_m[tid] = NEG;
    s_l[tid] = 0.0;
  }
  float acc[ACC_MAX];
  for (uint a = 0; a < ACC_MAX; ++a) acc[a] = 0.0;

  for (uint kv0 = kv_begin; kv0 < kv_end; kv0 += BKV) {
    barrier();
    // K tile, rotated pair by pair at each slot's position; V tile as stored.
    [[unroll]] for (uint it = 0; it < K_ITERS; ++it) {
      const uint e = tid + it * wg;
      if (!K_EXACT && e >= BKV * (HD / 2)) break;
      const uint j = e / (HD / 2), i = e % (HD / 2), idx = kv0 + j;
      uint d0, d1;
      bool rotated;
      rope_pair(i, HD, p.n_rot, p.neox != 0, d0, d1, rotated);
      float a = 0.0, b = 0.0;
      if (idx < kv_end) {
        const uint row = uint(kv_slots[idx]) * row_bytes;
        a = kc_at(row, hk * HD + d0);
        b = kc_at(row, hk * HD + d1);
        if (rotated) {
          const vec2 cs = rope_table[uint(kv_pos[idx]) * (HD / 2) + i];
          const float a2 = a * cs.x - b * cs.y;
          b = a * cs.y + b * cs.x;
          a = a2;
        }
      }
      ks[j * KS + d0] = a;
      ks[j * KS + d1] = b;
    }
    [[unroll]] for (uint it = 0; it < V_ITERS; ++it) {
      const uint e = tid + it * wg;
      if (!V_EXACT && e >= BKV * HD) break;
      const uint j = e / HD, d = e % HD, idx = kv0 + j;
      vs[e] = idx < kv_end ? vc_at(uint(kv_slots[idx]) * row_bytes, hk * HD + d) : 0.0;
    }
    if (tid < BKV) s_kpos[tid] = kv0 + tid < kv_end ? kv_pos[kv0 + tid] : 2147483647;
    barrier();
    [[unroll]] for (uint it = 0; it < S_ITERS; ++it) {
      const uint e = tid + it * wg;
      if (!S_EXACT && e >= BQ * BKV) break;
      const uint i = e / BKV, j = e % BKV;
      float s = NEG;
      if (s_kpos[j] <= s_qpos[i] && (p.window == 0 || s_qpos[i] - s_kpos[j] < int(p.window))) {
        s = 0.0;
        for (uint d = 0; d < HD; ++d) s += qs[i * HD + d] * ks[j * KS + d];
        if (p.softcap > 0.0) s = p.softcap * safe_tanh(s / p.softcap);
      }
      ss[e] = s;
    }
    barrier();
    if (tid < BQ) {  // online softmax update of row tid
      float mx = s_m[tid];
      for (uint j = 0; j < BKV; ++j) mx = max(mx, ss[tid * BKV + j]);
      const float corr = exp(s_m[tid] - mx);
      float sum = 0.0;
      for (uint j = 0; j < BKV; ++j) {
        const float s = ss[tid * BKV + j];
        const float pr = s <= NEG ? 0.0 : exp(s - mx);
        ss[tid * BKV + j] = pr;
        sum += pr;
      }
      s_l[tid] = s_l[tid] * corr + sum;
      s_m[tid] = mx;
      s_corr[tid] = corr;
    }
    barrier();
    for (uint a = 0; a < N_ACC; ++a) {
      const uint e = tid + a * wg;
      if (e >= BQ * HD) break;
      const uint i = e / HD, d = e % HD;
      float o = acc[a] * s_corr[i];
      for (uint j = 0; j < BKV; ++j) o += ss[i * BKV + j] * vs[j * HD + d];
      acc[a] = o;
    }
  }
  barrier();

  for (uint a = 0; a < N_ACC; ++a) {
    const uint e = tid + a * wg;
    if (e >= BQ * HD) break;
    const uint i = e / HD, d = e % HD, r = r0 + i;
    if (r >= n_rows) continue;
    if (part.n_split == 1) {
      const float l = s_l[i];
      out_[(part.q0 + r / G) * p.out_stride + (hk * G + r % G) * HD + d] = l > 0.0 ? acc[a] / l : 0.0;
    } else {
      const uint row = part.part_base + (part.split * p.n_head_kv + hk) * n_rows + r;  // [part][split][kv head][row]
      partial_o[row * HD + d] = acc[a];
      if (d == 0) {
        partial_ml[row * 2] = s_m[i];
        partial_ml[row * 2 + 1] = s_l[i];
      }
    }
  }
}
