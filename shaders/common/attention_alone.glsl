// The part of a pass's attention one workgroup of attention.comp or attention_simd.comp owns (and
// one row of attention_combine.comp merges): its query tokens, the range of the slot list they read
// and its split of that range.
//
// With p.alone = 0, the pass as a whole: every query token, the list split in p.n_split ranges of
// p.kv_per_split entries (grid z = split).
//
// With p.alone = 1, one query token per workgroup (grid z = token · p.n_split + split, tokens from
// p.q_first on), over the list a pass of that token alone reads: its own token is the list's
// entry n_kv − n_q + i (the pass's tokens are the list's last n_q entries, in order), nothing after
// it, and with a window nothing before the entry the engine starts a lone token's list at
// (window_list.glsl). That range is split as the host splits a lone token's list (attention.cpp,
// list_splits): same ranges, same tiles, so the token's floats do not depend on what else the pass
// holds. A speculative verify pass needs exactly that (docs/speculative.md).
//
// Needs p (AttentionParams), q_pos and kv_pos declared before it is included.

struct AttentionPart {
  uint q0;        // the first query token (index into q, q_pos and out)
  uint n_q;       // query tokens
  uint kv_begin;  // the split's entries of the list: [kv_begin, kv_end)
  uint kv_end;
  uint list_end;  // the end of the tokens' list (the last entry they read, plus one)
  uint split;     // this split, of n_split
  uint n_split;
  uint part_base; // partial rows before this part's: [part][split][kv head][row]
  bool live;      // false: a split past this token's last (the grid is sized for the longest list)
};

// Splits of a list of n entries: at least ATTENTION_SPLIT_MIN_KV entries each, at most cap
// (list_splits in core/kernels/attention.cpp).
void alone_splits(uint n, uint cap, out uint n_split, out uint per_split) {
  n = max(n, 1u);
  n_split = clamp(n / ATTENTION_SPLIT_MIN_KV, 1u, max(cap, 1u));
  per_split = max((n + n_split - 1) / n_split, 1u);
  n_split = (n + per_split - 1) / per_split;
}

int list_position(uint e) { return kv_pos[e]; }
#include "window_list.glsl"

// The part of grid slice z (gl_WorkGroupID.z) for query rows of G heads per token.
AttentionPart attention_part(uint z, uint G) {
  AttentionPart a;
  if (p.alone == 0) {
    a.q0 = 0;
    a.n_q = p.n_q;
    a.split = z;
    a.n_split = p.n_split;
    a.kv_begin = z * p.kv_per_split;
    a.kv_end = min(p.n_kv, a.kv_begin + p.kv_per_split);
    a.list_end = p.n_kv;
    a.part_base = 0;
    a.live = true;
    return a;
  }
  const uint part = z / p.n_split;
  a.q0 = p.q_first + part;
  a.n_q = 1;
  a.split = z % p.n_split;
  a.list_end = p.n_kv - p.n_q + a.q0 + 1;
  const uint begin = window_list_begin(q_pos[a.q0], a.list_end);
  // (The grid has the splits the host counts for the longest list; where a list's positions are
  // not logical indices the host's count may be short, and the list then takes fewer, longer splits.)
  uint per_split;
  alone_splits(a.list_end - begin, min(p.split_cap, p.n_split), a.n_split, per_split);
  a.kv_begin = begin + a.split * per_split;
  a.kv_end = min(a.list_end, a.kv_begin + per_split);
  a.part_base = part * p.n_split * p.n_head_kv * G;
  a.live = a.split < a.n_split;
  return a;
}
