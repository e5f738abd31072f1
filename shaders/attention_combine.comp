// attention_combine: merges the n_split partial results of attention.comp for each query row:
//   M = max_s m_s,  L = Σ_s l_s·e^(m_s−M),  out = Σ_s o_s·e^(m_s−M) / L.
// Bindings: 0 partial_o [n_split][n_head_kv][rows][HD] f32, 1 partial_ml [n_split][n_head_kv][rows][2] f32,
// 2 out [n_q][out_stride] f32. Grid: x = element d, y = query row, z = KV head.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer PartialO { float po[]; };
layout(binding = 1) readonly buffer PartialMl { float pml[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };
layout(push_constant) uniform Push { AttentionParams p; };

void main() {
  const uint d = gl_GlobalInvocationID.x, r = gl_GlobalInvocationID.y, hk = gl_GlobalInvocationID.z;
  const uint G = p.n_head / p.n_head_kv, n_rows = p.n_q * G;
  if (d >= p.head_dim || r >= n_rows || hk >= p.n_head_kv) return;
  float M = -1.0e30;
  for (uint s = 0; s < p.n_split; ++s) M = max(M, pml[((s * p.n_head_kv + hk) * n_rows + r) * 2]);
  float L = 0.0, o = 0.0;
  for (uint s = 0; s < p.n_split; ++s) {
    const uint row = (s * p.n_head_kv + hk) * n_rows + r;
    const float l = pml[row * 2 + 1];
    if (l <= 0.0) continue;
    const float w = exp(pml[row * 2] - M);
    L += l * w;
    o += po[row * p.head_dim + d] * w;
  }
  out_[(r / G) * p.out_stride + (hk * G + r % G) * p.head_dim + d] = L > 0.0 ? o / L : 0.0;
}
