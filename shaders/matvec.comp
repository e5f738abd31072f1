// matvec: y[dest(r, t)] (+)= W[r] · x[t] for activation vector t = the workgroup's z
// (decode: one; the server's step of several sequences: one per sequence, each computed exactly
// as it would be alone). A workgroup handles
// ROWS consecutive rows; each subgroup takes a row at a time, its invocations stride over the
// row's 8-element runs, and one subgroupAdd reduces it — no shared memory, no barrier. Correct
// for any actual subgroup count (rows are strided by gl_NumSubgroups).
// Where rows go, and the gated activation of a fused gate|up projection (each row then done for
// its gate row and its up row): common/matmul_out.glsl.
// Bindings: 0 W [rows][row_bytes] (weight type), 1 x [n_tokens][x_stride] f32, 2 y f32.
// Specialization: 0 workgroup size, 1 ROWS (rows per workgroup; the host uses size / subgroup size).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#define WEIGHT_BINDING 0
#include "dequant.glsl"
#include "params.h"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 8;
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { MatmulParams p; };
#include "matmul_out.glsl"

void main() {
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint first = wg * ROWS;
  const uint t = gl_WorkGroupID.z, x_at = t * p.x_stride;
  const uint halves = p.glu != 0u ? 2 : 1;
  for (uint r = first + gl_SubgroupID; r < min(first + ROWS, p.rows); r += gl_NumSubgroups) {
    float total = 0.0, gate = 0.0;
    for (uint h = 0; h < halves; ++h) {
      const uint row_base = (r + h * p.rows) * p.row_bytes;
      float acc = 0.0;
      for (uint k = gl_SubgroupInvocationID * 8; k < p.cols; k += gl_SubgroupSize * 8) {
        uint base, j8;
        dq_offsets(row_base, k, base, j8);
        float v[8];
        dq8(base, j8, min(8u, p.cols - k), v);
        for (uint i = 0; i < 8 && k + i < p.cols; ++i) acc += v[i] * x[x_at + k + i];
      }
      total = subgroupAdd(acc);
      if (h == 0) gate = total;
    }
    if (subgroupElect()) {
      const uint at = matmul_dest(r, t);
      y[at] = matmul_store_value(halves == 2 ? glu_apply(gate, total) : total, y[at]);
    }
  }
}
