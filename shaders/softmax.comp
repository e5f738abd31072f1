// softmax (OP_SOFTMAX), log-softmax (OP_LOG_SOFTMAX) and argmax (OP_ARGMAX) over each row, one
// workgroup per row. Bindings: 0 x [n_rows][n_cols] f32, 1 out: [n_rows][n_cols] f32 (may alias
// x) or, for argmax, [n_rows] i32.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) buffer X { float x[]; };
#if defined(OP_SOFTMAX) || defined(OP_LOG_SOFTMAX)
layout(binding = 1) buffer Out { float out_[]; };
#else
layout(binding = 1) writeonly buffer Out { int out_[]; };
#endif
layout(push_constant) uniform Push { RowParams p; };

shared float s_val[64];
shared uint s_idx[64];

void main() {
  const uint r = gl_WorkGroupID.x;
  if (r >= p.n_rows) return;
  const uint base = r * p.n_cols;
  // Row maximum (and, for argmax, the first index holding it).
  float best = -3.402823466e38;
  uint best_i = 0xFFFFFFFFu;
  for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) {
    const float v = x[base + i];
    if (v > best) { best = v; best_i = i; }
  }
  const float m = subgroupMax(best);
  const uint mi = subgroupMin(best == m ? best_i : 0xFFFFFFFFu);
  if (subgroupElect()) { s_val[gl_SubgroupID] = m; s_idx[gl_SubgroupID] = mi; }
  barrier();
  float row_max = s_val[0];
  uint row_arg = s_idx[0];
  for (uint s = 1; s < gl_NumSubgroups; ++s) {
    if (s_val[s] > row_max || (s_val[s] == row_max && s_idx[s] < row_arg)) { row_max = s_val[s]; row_arg = s_idx[s]; }
  }
#if defined(OP_ARGMAX)
  if (gl_LocalInvocationID.x == 0) out_[r] = int(row_arg);
#else
  barrier();
  float sum = 0.0;
  for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) sum += exp(x[base + i] - row_max);
  sum = subgroupAdd(sum);
  if (subgroupElect()) s_val[gl_SubgroupID] = sum;
  barrier();
  float total = 0.0;
  for (uint s = 0; s < gl_NumSubgroups; ++s) total += s_val[s];
#if defined(OP_LOG_SOFTMAX)
  const float shift = row_max + log(total);
  for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) out_[base + i] = x[base + i] - shift;
#else
  const float inv = 1.0 / total;
  for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) out_[base + i] = exp(x[base + i] - row_max) * inv;
#endif
#endif
}
