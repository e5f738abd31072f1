// kv_rotate: rebuilds rows of the rotated copy of K (f16 caches, CPU drivers' decode kernel;
// docs/kv-cache.md, "The rotated copy of K") from the un-rotated cache: listed entry t's row at
// slot slots[t] is rotated by RoPE at position rot[t]. Runs after a restore and when the copy's
// positions are rebased; the rotation is kv_store.comp's (ROT_COPY), element for element.
// Bindings: 0 k cache [n_slots][row_len] f16, 1 slots [n] i32, 2 rot [n] i32, 3 copy [row_len / HD]
// [copy_slots][HD] f16 (head-major), 4 rope table [pos][HD/2] (cos, sin). Push: KvStoreParams
// (n_tokens = entries, row_len, copy_slots).
// Specialization: 0 workgroup size, 1 HD, 2 N_ROT, 3 NEOX. Grid: x = elements, y = entries.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#include "params.h"
#include "rope.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint HD = 64;
layout(constant_id = 2) const uint N_ROT = 64;
layout(constant_id = 3) const bool NEOX = false;
layout(binding = 0) readonly buffer Cache { uint16_t k16[]; };
layout(binding = 1) readonly buffer Slots { int slots[]; };
layout(binding = 2) readonly buffer Rot { int rot[]; };
layout(binding = 3) writeonly buffer Copy { uint16_t copy16[]; };
layout(binding = 4) readonly buffer RopeTable { vec2 rope_table[]; };
layout(push_constant) uniform Push { KvStoreParams p; };

float at(uint i) { return f16_value(uint(k16[i])); }

void main() {
  const uint e = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (e >= p.row_len || t >= p.n_tokens) return;
  const uint slot = uint(slots[t]), row = slot * p.row_len, d = e % HD;
  uint partner, pair;
  bool first, rotated;
  rope_partner(d, N_ROT, NEOX, partner, pair, first, rotated);
  float x = at(row + e);
  if (rotated) x = rope_element(x, at(row + e - d + partner), rope_table[uint(rot[t]) * (HD / 2) + pair], first);
  copy16[rot_copy_index(e, slot, p.copy_slots, HD)] = uint16_t(packHalf2x16(vec2(x, 0.0)) & 0xFFFFu);
}
