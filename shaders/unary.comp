// unary: scale (out = x · s), softcap (out = s · tanh(x / s)), swiglu (out = silu(gate) · up) and
// geglu (out = gelu(gate) · up, GELU's tanh form as ggml computes it).
// Bindings: scale, softcap: 0 x, 1 out;  swiglu, geglu: 0 gate, 1 up, 2 out. All [n] f32.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"
#include "softcap.glsl"

layout(local_size_x_id = 0) in;
layout(push_constant) uniform Push { ScaleParams p; };
#if defined(OP_SCALE) || defined(OP_SOFTCAP)
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Out { float out_[]; };
#else
layout(binding = 0) readonly buffer Gate { float gate[]; };
layout(binding = 1) readonly buffer Up { float up[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };
#endif

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  if (i >= p.n) return;
#if defined(OP_SCALE)
  out_[i] = x[i] * p.s;
#elif defined(OP_SOFTCAP)
  out_[i] = p.s * safe_tanh(x[i] / p.s);
#elif defined(OP_SWIGLU)
  const float g = gate[i];
  out_[i] = g / (1.0 + exp(-g)) * up[i];
#elif defined(OP_GEGLU)
  const float g = gate[i];
  out_[i] = 0.5 * g * (1.0 + safe_tanh(0.7978845608 * g * (1.0 + 0.044715 * g * g))) * up[i];
#endif
}
