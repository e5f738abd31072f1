// get_rows: embedding lookup, dequantizing rows of any weight type to f32.
// Bindings: 0 W [n_rows][row_bytes] (weight type), 1 ids [n_tokens] i32, 2 out [n_tokens][out_stride] f32.
// Grid: x = 8-element runs of a row, y = token.
#version 450
#extension GL_GOOGLE_include_directive : require
#define WEIGHT_BINDING 0
#include "dequant.glsl"
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 1) readonly buffer Ids { int ids[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };
layout(push_constant) uniform Push { GetRowsParams p; };

void main() {
  const uint k = gl_GlobalInvocationID.x * 8;
  const uint t = gl_GlobalInvocationID.y;
  if (k >= p.cols || t >= p.n_tokens) return;
  const int id = ids[t];
  if (id < int(p.row_begin) || id >= int(p.row_begin + p.n_rows)) return;
  uint base, j8;
  dq_offsets(uint(id - int(p.row_begin)) * p.row_bytes, k, base, j8);
  float v[8];
  dq8(base, j8, min(8u, p.cols - k), v);
  for (uint i = 0; i < 8 && k + i < p.cols; ++i) out_[t * p.out_stride + k + i] = v[i];
}
