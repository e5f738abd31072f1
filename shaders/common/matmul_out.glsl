// Where matvec / matmul kernels write (MatmulParams' segments) and the gated activation of a
// fused gate|up projection. Include after the push constants are declared as `p`.
#ifndef VKLLM_MATMUL_OUT_GLSL
#define VKLLM_MATMUL_OUT_GLSL
#include "softcap.glsl"

// y index of row r of this binding, activation row t of this dispatch.
uint matmul_dest(uint r, uint t) {
  const uint g = p.row_begin + r, c = p.col_begin + t;
  if (g < p.seg_row) return c * p.y_stride + g;
  const uint s = (g - p.seg_row) / p.seg_len;
  return p.seg_base + s * p.seg_size + c * p.seg_stride + (g - p.seg_row - s * p.seg_len);
}

// act(gate) · up, as unary.comp's swiglu and geglu compute it.
float glu_apply(float gate, float up) {
  if (p.glu == 2u) return 0.5 * gate * (1.0 + safe_tanh(0.7978845608 * gate * (1.0 + 0.044715 * gate * gate))) * up;
  return gate / (1.0 + exp(-gate)) * up;
}

// The value stored at `at`: the sum, plus what is there when accumulating.
float matmul_store_value(float v, float old) { return v + (p.accumulate != 0u ? old : 0.0); }

#endif
