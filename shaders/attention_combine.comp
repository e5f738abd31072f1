// attention_combine: merges the n_split partial results of attention.comp for each query row:
//   M = max_s m_s,  L = Σ_s l_s·e^(m_s−M),  out = Σ_s o_s·e^(m_s−M) / L.
// Bindings: 0 partial_o [n_split][n_head_kv][rows][HD] f32, 1 partial_ml [n_split][n_head_kv][rows][2] f32,
// 2 out [n_q][out_stride] f32, 3 q_pos [n_q] i32, 4 kv_pos [n_kv] i32 (read with p.alone, where each
// token's rows merge its own splits, [token][split][n_head_kv][G]: common/attention_alone.glsl).
// Grid: x = element d, y = query row (of the tokens from p.q_first on, with p.alone), z = KV head.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer PartialO { float po[]; };
layout(binding = 1) readonly buffer PartialMl { float pml[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };
layout(binding = 3) readonly buffer QPos { int q_pos[]; };
layout(binding = 4) readonly buffer KvPos { int kv_pos[]; };
layout(push_constant) uniform Push { AttentionParams p; };
#include "attention_alone.glsl"

void main() {
  const uint d = gl_GlobalInvocationID.x, y = gl_GlobalInvocationID.y, hk = gl_GlobalInvocationID.z;
  const uint G = p.n_head / p.n_head_kv;
  const uint rows = p.alone != 0 ? G : p.n_q * G;  // a part's rows
  const uint n_parts = p.alone != 0 ? p.n_q - p.q_first : 1;
  if (d >= p.head_dim || y >= n_parts * rows || hk >= p.n_head_kv) return;
  const uint r = y % rows;
  // The part's first split (its token, with p.alone): its n_split and rows.
  const AttentionPart part = attention_part((y / rows) * p.n_split, G);
  if (part.n_split == 1) return;  // a token whose list takes one split: attention.comp wrote it
  float M = -1.0e30;
  for (uint s = 0; s < part.n_split; ++s) M = max(M, pml[(part.part_base + (s * p.n_head_kv + hk) * rows + r) * 2]);
  float L = 0.0, o = 0.0;
  for (uint s = 0; s < part.n_split; ++s) {
    const uint row = part.part_base + (s * p.n_head_kv + hk) * rows + r;
    const float l = pml[row * 2 + 1];
    if (l <= 0.0) continue;
    const float w = exp(pml[row * 2] - M);
    L += l * w;
    o += po[row * p.head_dim + d] * w;
  }
  out_[(part.q0 + r / G) * p.out_stride + (hk * G + r % G) * p.head_dim + d] = L > 0.0 ? o / L : 0.0;
}
