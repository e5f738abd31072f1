// RoPE angle of pair i at position pos (ggml_rope_ext; YaRN below):
//   theta = pos · freq_scale · freq_base^(−2i / n_rot) / factor_i
// and the pair layout: Normal rotates dims (2i, 2i+1); NeoX rotates (i, i + n_rot/2). Dims at or
// past n_rot are left as they are.

// The two dims of pair i (0 ≤ i < head_dim/2) and whether that pair is rotated.
void rope_pair(uint i, uint head_dim, uint n_rot, bool neox, out uint d0, out uint d1, out bool rotated) {
  rotated = 2 * i < n_rot;
  if (!neox || !rotated) {
    d0 = neox ? n_rot + 2 * (i - n_rot / 2) : 2 * i;
    d1 = d0 + 1;
  } else {
    d0 = i;
    d1 = i + n_rot / 2;
  }
}

float rope_theta(float pos, uint i, uint n_rot, float freq_base, float freq_scale, float factor) {
  return pos * freq_scale * pow(freq_base, -2.0 * float(i) / float(n_rot)) / factor;
}

// YaRN (ggml's rope_yarn): the angle of pair i mixes the interpolated θ·freq_scale with the
// extrapolated θ (freq_scale 1) by ext_factor · ramp, the ramp 1 for pairs up to corr_lo and 0 from
// corr_hi (fast-turning pairs keep their angle; slow ones are interpolated).
float rope_theta_yarn(float pos, uint i, uint n_rot, float freq_base, float freq_scale, float factor, float ext_factor,
                      float corr_lo, float corr_hi) {
  const float extrap = rope_theta(pos, i, n_rot, freq_base, 1.0, factor);
  const float interp = freq_scale * extrap;
  const float ramp = 1.0 - clamp((float(i) - corr_lo) / max(0.001, corr_hi - corr_lo), 0.0, 1.0);
  const float mix_ = ramp * ext_factor;
  return interp * (1.0 - mix_) + extrap * mix_;
}

// Element d of a head after RoPE by (cos, sin) = cs, given the element (self) and its pair partner:
// the first of a pair becomes self·cos − partner·sin, the second partner·sin + self·cos (the
// pair's own order, as the K rotation of the attention kernels computes it). `partner`, `pair`,
// `first` and `rotated` come from rope_partner.
void rope_partner(uint d, uint n_rot, bool neox, out uint partner, out uint pair, out bool first, out bool rotated) {
  rotated = d < n_rot;
  if (neox) {
    first = d < n_rot / 2;
    pair = first ? d : d - n_rot / 2;
    partner = first ? d + n_rot / 2 : d - n_rot / 2;
  } else {
    first = (d & 1u) == 0;
    pair = d / 2;
    partner = d ^ 1u;
  }
}

// `precise`: no fused multiply-add, so every shader that rotates the same value rounds it the same
// way (kv_store's rotated copy of K and kv_rotate's rebuild of it must agree bit for bit; NVIDIA's
// compiler fused the two differently, measured on an H200).
float rope_element(float self, float partner, vec2 cs, bool first) {
  precise float a = self * cs.x, b = partner * cs.y;
  precise float r = first ? a - b : b + a;
  return r;
}

// The value of an f16 whose bits are h, decoded with integer operations only. kv_store (from the
// bits it writes) and kv_rotate (from the bits it reads) both take K's elements through it, so that
// no f16 round trip a compiler may fold differently in the two shaders comes between them (with
// unpackHalf2x16 they still differed on an H200, `precise` rotation notwithstanding).
float f16_value(uint h) {
  const uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0u) return uintBitsToFloat(sign | floatBitsToUint(float(m) * exp2(-24.0)));  // zero, subnormal: exact
  return uintBitsToFloat(sign | (e == 31u ? 0x7F800000u : (e + 112u) << 23) | (m << 13));
}

// Where element e of slot `slot`'s K row (head e / head_dim, dim e % head_dim) lies in the rotated
// copy of K, which is head-major: [row_len / head_dim][copy_slots][head_dim] f16, so the decode
// kernel streams one head's rows contiguously (docs/kv-cache.md, "The rotated copy of K").
uint rot_copy_index(uint e, uint slot, uint copy_slots, uint head_dim) {
  return ((e / head_dim) * copy_slots + slot) * head_dim + e % head_dim;
}
