// quantize_x: x's columns as 8-bit blocks for matvec's integer dot products (MatvecTuning::q8x;
// params.h's QuantizeXParams has the layout). One invocation per 32-element block: scale =
// max |x| / 127, q = x / scale rounded half away from zero (as llama.cpp's q8_0), a zero block
// scale 0. The blocks of one column are independent of the other columns, so a column's result does
// not depend on the batch it runs in.
// Bindings: 0 x f32, 1 out (words). Specialization: 0 workgroup size. Grid: x = blocks of a column, y = columns.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Q { uint q[]; };
layout(binding = 1) writeonly buffer QF { float qf[]; };
layout(push_constant) uniform Push { QuantizeXParams p; };

void main() {
  const uint b = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (b * 32 >= p.cols || t >= p.n_tokens) return;
  const uint at = t * p.x_stride + b * 32, o = t * p.out_stride;
  float amax = 0.0;
  for (uint j = 0; j < 32; ++j) amax = max(amax, abs(x[at + j]));
  // (A block of magnitudes below 1e-30 is all zeros: 1 / d of a subnormal d would be infinite.)
  const float d = amax / 127.0, id = amax >= 1e-30 ? 1.0 / d : 0.0;
  for (uint w = 0; w < 8; ++w) {
    uint packed = 0;
    for (uint k = 0; k < 4; ++k) {
      const float v = x[at + 4 * w + k] * id;
      packed |= (uint(int(sign(v) * floor(abs(v) + 0.5))) & 0xFFu) << (8 * k);
    }
    q[o + b * 8 + w] = packed;
  }
  qf[o + p.cols / 4 + b] = d;
}
