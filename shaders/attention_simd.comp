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
// Slots whose position is greater than the query's are masked, and with a window those at or
// below its position − window; positions ascend along the slot list (the cache lists them so), so
// a workgroup stops at the first slot past its last query and skips blocks behind its windows.
// Scores may be soft-capped (Gemma 2).
//
// Bindings and push constants: those of attention.comp (p.alone too: common/attention_alone.glsl).
// Specialization: 0 W (the subgroup size), 1 HD (head_dim, even), 2 R, 3 N_ROT, 4 NEOX, 5 SOFTCAP.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#include "kv_cache.glsl"
#include "params.h"
#include "softcap.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;
layout(constant_id = 2) const uint R = 1;
layout(constant_id = 3) const uint N_ROT = 64;
layout(constant_id = 4) const bool NEOX = false;
layout(constant_id = 5) const bool SOFTCAP = false;  // p.softcap > 0 (a branch lavapipe runs for every lane either way)
const float NEG = -1.0e30;
const float RESCALE_AT = 8.0;  // probabilities stay below e^8 before the running max is raised

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 3) readonly buffer KvSlots { int kv_slots[]; };
layout(binding = 4) readonly buffer KvPos { int kv_pos[]; };
layout(binding = 5) readonly buffer QPos { int q_pos[]; };
layout(binding = 6) writeonly buffer PartialO { float partial_o[]; };
layout(binding = 7) writeonly buffer PartialMl { float partial_ml[]; };
layout(binding = 9) writeonly buffer Out { float out_[]; };
layout(binding = 8) readonly buffer RopeTable { u64vec2 rope_table[]; };  // [pos][HD/2] (cos, sin), two pairs per element
CACHE_RUN_READER(kc, 1)
CACHE_RUN_READER(vc, 2)
const uint ANCHOR_EVERY = 16;  // blocks between reloads of the angles from the table
layout(push_constant) uniform Push { AttentionParams p; };
#include "attention_alone.glsl"

// The rope table's (cos, sin) of pairs 2j and 2j + 1 at position pos.
void table_pairs(uint pos, uint j, out vec2 a, out vec2 b) {
  const u64vec2 w = rope_table[(pos * (HD / 2) + 2 * j) >> 1];
  a = uintBitsToFloat(unpackUint2x32(w.x));
  b = uintBitsToFloat(unpackUint2x32(w.y));
}

void main() {
  const uint W = gl_WorkGroupSize.x, lane = gl_LocalInvocationID.x;
  const uint G = p.n_head / p.n_head_kv;
  const uint hk = gl_WorkGroupID.y;
  const AttentionPart part = attention_part(gl_WorkGroupID.z, G);
  if (!part.live) return;
  const uint n_rows = part.n_q * G;
  const uint r0 = gl_WorkGroupID.x * R;
  const uint kv_begin = part.kv_begin, kv_end = part.kv_end;
  const uint row_bytes = cache_row_bytes(p.n_head_kv * HD);

  float qv[R * HD], ov[R * HD], m[R], l[R];
  int qpos[R];
  int qmax = -2147483647, qmin = 2147483647;
  [[unroll]] for (uint i = 0; i < R; ++i) {
    const uint r = min(r0 + i, n_rows - 1);
    const bool live = r0 + i < n_rows;
    const uint at = (part.q0 + r / G) * p.q_stride + (hk * G + r % G) * HD;
    [[unroll]] for (uint d = 0; d < HD; ++d) {
      qv[i * HD + d] = live ? q[at + d] : 0.0;
      ov[i * HD + d] = 0.0;
    }
    qpos[i] = live ? q_pos[part.q0 + r / G] : -2147483647;
    // RoPE on the query row at its token's position (q arrives un-rotated), then the scale.
    [[unroll]] for (uint j = 0; j < N_ROT / 4; ++j) {
      vec2 cs[2];
      table_pairs(uint(max(qpos[i], 0)), j, cs[0], cs[1]);
      [[unroll]] for (uint k = 0; k < 2; ++k) {
        const uint pr = 2 * j + k, d0 = NEOX ? pr : 2 * pr, d1 = NEOX ? pr + N_ROT / 2 : 2 * pr + 1;
        const float a = qv[i * HD + d0], b = qv[i * HD + d1];
        qv[i * HD + d0] = a * cs[k].x - b * cs[k].y;
        qv[i * HD + d1] = a * cs[k].y + b * cs[k].x;
      }
    }
    [[unroll]] for (uint d = 0; d < HD; ++d) qv[i * HD + d] *= p.scale;
    qmax = max(qmax, qpos[i]);
    if (live) qmin = min(qmin, qpos[i]);
    m[i] = NEG;
    l[i] = 0.0;
  }

  // This lane's RoPE angles (cos, sin per pair) at its slot's position, and those of position W:
  // when a block's positions are the previous block's plus W (positions are logical indices, so
  // that is the usual case), the angles advance by one complex product instead of a table load
  // per pair, which would cost as much as the K row. They are reloaded every ANCHOR_EVERY blocks,
  // which bounds the rounding the products accumulate (≈ 1e-6). The decision is the same for
  // every lane, taken from two loads at uniform addresses, as positions ascend strictly.
  vec2 ang[N_ROT / 2], step[N_ROT / 2];
  const uint step_row = min(W, uint(max(kv_pos[part.list_end - 1], 0)));  // used only when positions reach W
  [[unroll]] for (uint j = 0; j < N_ROT / 4; ++j) table_pairs(step_row, j, step[2 * j], step[2 * j + 1]);
  // The table's rotated pairs are scaled by attn_factor; a step must be a pure rotation.
  [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i) step[i] /= p.attn_factor;
  int prev_pos0 = -2147483647;
  bool prev_steady = false;

  for (uint kv0 = kv_begin, n = 0; kv0 < kv_end; kv0 += W, ++n) {
    const int pos0 = kv_pos[kv0];
    if (pos0 > qmax) break;  // positions ascend: no later slot is visible to these rows
    const uint last = min(kv0 + W, kv_end) - 1;
    // Blocks wholly behind every row's window are skipped; they all come before the first block
    // read, so the angle bookkeeping below starts from the table there.
    if (p.window != 0 && kv_pos[last] + int(p.window) <= qmin) continue;
    const bool steady = kv_pos[last] - pos0 == int(last - kv0);  // the block's positions are consecutive
    const bool advance = steady && prev_steady && pos0 == prev_pos0 + int(W) && n % ANCHOR_EVERY != 0;
    prev_steady = steady && last == kv0 + W - 1;
    prev_pos0 = pos0;
    const uint idx = min(kv0 + lane, kv_end - 1);
    const int pos = kv_pos[idx];
    const int kpos = kv0 + lane < kv_end ? pos : 2147483647;
    const uint row = uint(kv_slots[idx]) * row_bytes;
    if (advance) {
      [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i)
        ang[i] = vec2(ang[i].x * step[i].x - ang[i].y * step[i].y, ang[i].x * step[i].y + ang[i].y * step[i].x);
    } else {
      [[unroll]] for (uint j = 0; j < N_ROT / 4; ++j) table_pairs(uint(pos), j, ang[2 * j], ang[2 * j + 1]);
    }
    float kx[HD], vx[HD];
    CACHE_LOAD_RUN(kc, row, hk * HD, HD, kx)
    CACHE_LOAD_RUN(vc, row, hk * HD, HD, vx)
    // RoPE on K at the slot's position: pairs (2i, 2i+1), or (i, i + N_ROT/2) for NeoX.
    [[unroll]] for (uint i = 0; i < N_ROT / 2; ++i) {
      const vec2 cs = ang[i];
      const uint d0 = NEOX ? i : 2 * i, d1 = NEOX ? i + N_ROT / 2 : 2 * i + 1;
      const float a = kx[d0], b = kx[d1];
      kx[d0] = a * cs.x - b * cs.y;
      kx[d1] = a * cs.y + b * cs.x;
    }

    [[unroll]] for (uint i = 0; i < R; ++i) {
      float s = 0.0;
      [[unroll]] for (uint d = 0; d < HD; ++d) s += qv[i * HD + d] * kx[d];
      if (SOFTCAP) s = p.softcap * safe_tanh(s / p.softcap);
      const bool visible = kpos <= qpos[i] && (p.window == 0 || qpos[i] - kpos < int(p.window));
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
    if (part.n_split == 1) {
      const uint at = (part.q0 + r / G) * p.out_stride + (hk * G + r % G) * HD;
      [[unroll]] for (uint d = 0; d < HD; ++d) out_[at + d] = l[i] > 0.0 ? ov[i * HD + d] / l[i] : 0.0;
    } else {
      const uint row = part.part_base + (part.split * p.n_head_kv + hk) * n_rows + r;  // [part][split][kv head][row]
      [[unroll]] for (uint d = 0; d < HD; ++d) partial_o[row * HD + d] = ov[i * HD + d];
      partial_ml[row * 2] = m[i];
      partial_ml[row * 2 + 1] = l[i];
    }
  }
}
