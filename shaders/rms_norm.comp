// rms_norm: out[r] = x[r] / sqrt(mean(x[r]²) + eps) * w, one workgroup per row.
// Bindings: 0 x [n_rows][x_stride] f32, 1 w [n_cols] f32, 2 out [n_rows][out_stride] f32 (may alias x).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };
layout(push_constant) uniform Push { NormParams p; };

// One partial sum per subgroup: the host's workgroups hold at most 32 of the reported subgroup
// size, so a driver running subgroups as narrow as a quarter of what it reports still fits.
shared float partial[128];

void main() {
  const uint r = gl_WorkGroupID.x;
  if (r >= p.n_rows) return;
  const uint xb = r * p.x_stride, ob = r * p.out_stride;
  float sum = 0.0;
  for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) sum += x[xb + i] * x[xb + i];
  sum = subgroupAdd(sum);
  if (subgroupElect()) partial[gl_SubgroupID] = sum;
  barrier();
  float total = 0.0;
  for (uint s = 0; s < gl_NumSubgroups; ++s) total += partial[s];
  const float inv = inversesqrt(total / float(p.n_cols) + p.eps);
  for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) out_[ob + i] = x[xb + i] * inv * w[i];
}
