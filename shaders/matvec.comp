// matvec: y[y_offset + r] = W[r] · x for one activation vector (decode). One workgroup per
// weight row; threads stride over 8-element runs, then a subgroup + shared-memory reduction.
// Bindings: 0 W [rows][row_bytes] (weight type), 1 x [cols] f32, 2 y f32.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define WEIGHT_BINDING 0
#include "dequant.glsl"
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { MatmulParams p; };

shared float partial[64];  // one per subgroup (≥ 1024 / 16 subgroups)

void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (r >= p.rows) return;
  const uint row_base = r * p.row_bytes;
  float acc = 0.0;
  for (uint k = gl_LocalInvocationID.x * 8; k < p.cols; k += gl_WorkGroupSize.x * 8) {
    uint base, j8;
    dq_offsets(row_base, k, base, j8);
    float v[8];
    dq8(base, j8, min(8u, p.cols - k), v);
    for (uint i = 0; i < 8 && k + i < p.cols; ++i) acc += v[i] * x[k + i];
  }
  acc = subgroupAdd(acc);
  if (subgroupElect()) partial[gl_SubgroupID] = acc;
  barrier();
  if (gl_LocalInvocationID.x == 0) {
    float sum = 0.0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) sum += partial[s];
    y[p.y_offset + r] = sum;
  }
}
