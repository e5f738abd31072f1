// rms_norm: out[r] = x[r] / sqrt(mean(x[r]²) + eps) * w, one workgroup per row.
// Bindings: 0 x [n_rows][x_stride] f32, 1 w [n_cols] f32, 2 out [n_rows][out_stride] f32 (may alias x).
// TEXEL_ROWS (rms_norm_texel, CPU drivers, one subgroup per workgroup): x, w and out as 16-byte
// texels (rgba32ui storage texel buffers; x and out bound as their whole buffers, row 0 at texel
// p.x_base / p.out_base), each lane taking four elements at a time. lavapipe turns a per-lane
// storage-buffer load or store into a loop over the lanes, one scalar access per element, and serves
// a texel access as one 16-byte access per lane (docs/performance.md, "rms_norm as texels"). Needs
// n_cols, both strides and both bases whole texels; every lane reads and writes only its own texels,
// so out may be x.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(push_constant) uniform Push { NormParams p; };

#if defined(TEXEL_ROWS)
layout(binding = 0, rgba32ui) uniform readonly uimageBuffer x_tex;
layout(binding = 1, rgba32ui) uniform readonly restrict uimageBuffer w_tex;
layout(binding = 2, rgba32ui) uniform writeonly uimageBuffer out_tex;

void main() {
  const uint r = gl_WorkGroupID.x;
  if (r >= p.n_rows) return;
  const uint n4 = p.n_cols / 4, xb = p.x_base + r * (p.x_stride / 4), ob = p.out_base + r * (p.out_stride / 4);
  vec4 sum4 = vec4(0.0);
  for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x) {
    const vec4 v = uintBitsToFloat(imageLoad(x_tex, int(xb + i)));
    sum4 += v * v;
  }
  const float total = subgroupAdd((sum4.x + sum4.y) + (sum4.z + sum4.w));
  const float inv = inversesqrt(total / float(p.n_cols) + p.eps);
  for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x) {
    const vec4 v = uintBitsToFloat(imageLoad(x_tex, int(xb + i))), w = uintBitsToFloat(imageLoad(w_tex, int(i)));
    imageStore(out_tex, int(ob + i), floatBitsToUint(v * inv * w));
  }
}
#else
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };

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
#endif
