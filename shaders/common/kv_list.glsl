// The slot list and its positions of the CPU-driver attention kernels (attention_decode,
// attention_lanes) as texels of one i32: bindings 3 and 4, bound from their buffers' start, entry 0
// of the list at p.kv_slots_base / p.kv_pos_base (one view per buffer whatever the step). Each
// kernel reads them at a per-lane or a one-for-all address inside its slot loop, which lavapipe runs
// as a loop over the lanes through memory for a storage buffer (a stalled store-to-load forward per
// lane) and as one load per lane for a texel buffer. Include after the push constants (`p`).
layout(binding = 3, r32ui) uniform readonly restrict uimageBuffer kv_slots_tex;
layout(binding = 4, r32ui) uniform readonly restrict uimageBuffer kv_pos_tex;
uint kv_slot(uint e) { return imageLoad(kv_slots_tex, int(p.kv_slots_base + e)).x; }
int kv_position(uint e) { return int(imageLoad(kv_pos_tex, int(p.kv_pos_base + e)).x); }
