// binary: element-wise a OP b with b broadcast by period (add, residual add, bias add, mul).
// Bindings: 0 a [n] f32, 1 b [b_period] f32, 2 out [n] f32 (may alias a).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };
layout(push_constant) uniform Push { BinaryParams p; };

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  if (i >= p.n) return;
#if defined(OP_ADD)
  out_[i] = a[i] + b[i % p.b_period];
#elif defined(OP_MUL)
  out_[i] = a[i] * b[i % p.b_period];
#else
#error "define OP_ADD or OP_MUL"
#endif
}
