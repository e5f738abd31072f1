// rope_table: cos and sin of every (position, pair) angle for positions 0 … n_pos−1, so attention
// can rotate cached K at read time with one table load per pair instead of a pow, sin and cos.
// Rotated pairs are scaled by attn_factor (ggml's mscale, YaRN's term included by the host); the
// attention kernels rotate q and K with it. YaRN's per-pair mix when ext_factor > 0 (rope.glsl).
// Bindings: 0 table [n_pos][head_dim/2] vec2 (cos, sin), 1 factors [n_rot/2] f32 (when has_factors).
// Pairs at or past n_rot/2 get (1, 0): no rotation. Grid: x = pair, y = position − p.pos_first.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"
#include "rope.glsl"

layout(local_size_x_id = 0) in;
layout(binding = 0) writeonly buffer Table { vec2 table[]; };
layout(binding = 1) readonly buffer Factors { float factors[]; };
layout(push_constant) uniform Push { RopeParams p; };

void main() {
  const uint i = gl_GlobalInvocationID.x, pos = p.pos_first + gl_GlobalInvocationID.y;
  const uint half_dim = p.head_dim / 2;
  if (i >= half_dim || pos >= p.n_pos) return;
  vec2 cs = vec2(1.0, 0.0);
  if (2 * i < p.n_rot) {
    const float factor = p.has_factors != 0 ? factors[i] : 1.0;
    const float theta = p.ext_factor > 0.0
                            ? rope_theta_yarn(float(pos), i, p.n_rot, p.freq_base, p.freq_scale, factor, p.ext_factor, p.corr_lo, p.corr_hi)
                            : rope_theta(float(pos), i, p.n_rot, p.freq_base, p.freq_scale, factor);
    cs = vec2(cos(theta), sin(theta)) * p.attn_factor;
  }
  table[pos * half_dim + i] = cs;
}
