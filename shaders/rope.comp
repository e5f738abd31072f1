// rope: rotates each head of each token in place by its position (applied to Q; K is rotated as
// attention reads it). Bindings: 0 x [n_tokens][token_stride] f32 (heads packed), 1 pos [n_tokens]
// i32, 2 factors [n_rot/2] f32 (read only when has_factors). Grid: x = pair, y = head, z = token.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"
#include "rope.glsl"

layout(local_size_x_id = 0) in;
layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) readonly buffer Factors { float factors[]; };
layout(push_constant) uniform Push { RopeParams p; };

void main() {
  const uint i = gl_GlobalInvocationID.x, h = gl_GlobalInvocationID.y, t = gl_GlobalInvocationID.z;
  if (i >= p.head_dim / 2 || h >= p.n_heads || t >= p.n_tokens) return;
  uint d0, d1;
  bool rotated;
  rope_pair(i, p.head_dim, p.n_rot, p.neox != 0, d0, d1, rotated);
  if (!rotated) return;
  const float factor = p.has_factors != 0 ? factors[i] : 1.0;
  const float theta = rope_theta(float(pos[t]), i, p.n_rot, p.freq_base, p.freq_scale, factor);
  const float c = cos(theta) * p.attn_factor, s = sin(theta) * p.attn_factor;
  const uint base = t * p.token_stride + h * p.head_dim;
  const float a = x[base + d0], b = x[base + d1];
  x[base + d0] = a * c - b * s;
  x[base + d1] = a * s + b * c;
}
