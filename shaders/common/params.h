// Push-constant structs shared verbatim by the C++ host (core/) and the GLSL kernels (shaders/).
// Both sides include this file; the host static_asserts each struct's size (core/kernel_params.h).
// Rules: only 4-byte fields (u32, i32, float), no arrays, no padding.
#ifndef VKLLM_PARAMS_H
#define VKLLM_PARAMS_H
#ifdef __cplusplus
#include <cstdint>
namespace vkllm {
using u32 = uint32_t;
using i32 = int32_t;
#else
#define u32 uint
#define i32 int
#endif

struct FillParams {
  u32 n;        // elements to write
  float value;  // value written to each
};

#ifdef __cplusplus
}  // namespace vkllm
#else
#undef u32
#undef i32
#endif
#endif
