// unary: scale (out = x · s) and swiglu (out = silu(gate) · up).
// Bindings: scale: 0 x, 1 out;  swiglu: 0 gate, 1 up, 2 out. All [n] f32.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(push_constant) uniform Push { ScaleParams p; };
#if defined(OP_SCALE)
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Out { float out_[]; };
#elif defined(OP_SWIGLU)
layout(binding = 0) readonly buffer Gate { float gate[]; };
layout(binding = 1) readonly buffer Up { float up[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };
#endif

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  if (i >= p.n) return;
#if defined(OP_SCALE)
  out_[i] = x[i] * p.s;
#elif defined(OP_SWIGLU)
  const float g = gate[i];
  out_[i] = g / (1.0 + exp(-g)) * up[i];
#endif
}
