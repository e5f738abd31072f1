// read_ceiling: streams a buffer with uvec4 loads and nothing else, for `vkllm bench --ops`'s
// "read ceiling" rows: the device's read rate for the bytes a matvec reads, with no arithmetic.
// Each invocation reads per_invocation vec4 words and writes their XOR, so the loads cannot be
// dropped: on CPU drivers one contiguous run (stride 0; 4 KiB, where they read fastest), on GPUs
// words id, id + stride, id + 2·stride, … (stride = the invocations), so that a subgroup's loads
// cover one stretch of memory, as a GPU reads fastest.
// Two variants: storage-buffer loads (read_ceiling), and with TEXEL texel loads of a storage texel
// buffer (read_ceiling_texel), the way the CPU-driver kernels read weights and the f16 cache;
// lavapipe serves the latter several times faster.
// Bindings: 0 data [n_words] uvec4 (TEXEL: rgba32ui texels), 1 out [invocations] u32.
// Specialization: 0 workgroup size.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"

layout(local_size_x_id = 0) in;
#if defined(TEXEL)
layout(binding = 0, rgba32ui) uniform readonly restrict uimageBuffer data;
#define LOAD(i) imageLoad(data, int(i))
#else
layout(binding = 0) readonly buffer Data { uvec4 data[]; };
#define LOAD(i) data[i]
#endif
layout(binding = 1) writeonly buffer Out { uint out_[]; };
layout(push_constant) uniform Push { ReadCeilingParams p; };

void main() {
  const uint id = gl_GlobalInvocationID.x;
  uvec4 acc = uvec4(0);
  if (p.stride == 0) {
    const uint begin = id * p.per_invocation, end = min(begin + p.per_invocation, p.n_words);
    for (uint i = begin; i < end; ++i) acc ^= LOAD(i);
    if (begin < p.n_words) out_[id] = acc.x ^ acc.y ^ acc.z ^ acc.w;
  } else if (id < p.stride) {
    for (uint k = 0, i = id; k < p.per_invocation && i < p.n_words; ++k, i += p.stride) acc ^= LOAD(i);
    out_[id] = acc.x ^ acc.y ^ acc.z ^ acc.w;
  }
}
