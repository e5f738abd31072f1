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

// get_rows: out[t][0..cols) = dequant(W[ids[t] - row_begin]) for the tokens whose id falls in
// [row_begin, row_begin + n_rows) (a weight split into parts is gathered part by part).
struct GetRowsParams {
  u32 n_tokens;   // rows of ids / out
  u32 cols;       // elements per weight row
  u32 row_bytes;  // bytes per weight row
  u32 row_begin;  // first weight row held by this binding
  u32 n_rows;     // weight rows held by this binding
  u32 out_stride; // floats between output rows
};

// matvec / matmul: y[t][y_offset + r] = sum_c W[r][c] * x[t][c] for r < rows, t < n_tokens.
struct MatmulParams {
  u32 cols;       // elements per weight row (= x row length)
  u32 rows;       // weight rows in this binding
  u32 row_bytes;  // bytes per weight row
  u32 n_tokens;   // activation rows (1 for matvec)
  u32 x_stride;   // floats between activation rows
  u32 y_stride;   // floats between output rows
  u32 y_offset;   // first output column written (row offset of this weight part)
};

#ifdef __cplusplus
}  // namespace vkllm
#else
#undef u32
#undef i32
#endif
#endif
