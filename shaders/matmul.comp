// matmul: y[dest(r, t)] (+)= W[r] · X[t] for many activation rows (prefill, on GPUs; dest and its
// segments: common/matmul_out.glsl, no glu). A workgroup of 256 computes a 64-row × 64-token tile,
// stepping through the columns 32 at a time with the weight tile dequantized once into shared
// memory. Each thread keeps a 4-row × 4-token register block: per column step it reads one vec4 of
// weights (its 4 rows) and one vec4 of activations (its 4 tokens) from shared memory for 16
// multiply-adds (the 4 × 2 block of the first version read 6 scalars for 8). Each output's sum
// still runs over the columns in order, so the results are those of the first version.
// Bindings: 0 W [rows][row_bytes] (weight type), 1 X [n_tokens][x_stride] f32, 2 Y [n_tokens][y_stride] f32.
#version 450
#extension GL_GOOGLE_include_directive : require
#define WEIGHT_BINDING 0
#include "dequant.glsl"
#include "params.h"

#define BM 64
#define BN 64
#define BK 32

layout(local_size_x = 256) in;
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { MatmulParams p; };
#include "matmul_out.glsl"

// [k][rows / 4] and [k][tokens / 4]: 8 KiB each, 16 KiB together (every Vulkan device has that much).
shared vec4 ws[BK][BM / 4];
shared vec4 xs[BK][BN / 4];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint row0 = gl_WorkGroupID.x * BM;
  const uint tok0 = gl_WorkGroupID.y * BN;
  const uint tr = tid % (BM / 4);  // this thread's rows: row0 + 4 tr …
  const uint tc = tid / (BM / 4);  // this thread's tokens: tok0 + 4 tc …
  vec4 acc[4];                     // acc[i][j]: row 4 tr + i, token 4 tc + j
  for (uint i = 0; i < 4; ++i) acc[i] = vec4(0.0);

  for (uint k0 = 0; k0 < p.cols; k0 += BK) {
    {  // weight tile: 64 rows × 32 columns = 256 runs of 8, one per thread
      const uint lr = tid / (BK / 8), lk = (tid % (BK / 8)) * 8;
      const uint r = row0 + lr, k = k0 + lk;
      float v[8];
      if (r < p.rows && k < p.cols) {
        uint base, j8;
        dq_offsets(r * p.row_bytes, k, base, j8);
        dq8(base, j8, min(8u, p.cols - k), v);
      } else {
        for (uint i = 0; i < 8; ++i) v[i] = 0.0;
      }
      for (uint i = 0; i < 8; ++i) ws[lk + i][lr / 4][lr % 4] = v[i];
    }
    // activation tile: 64 tokens × 32 columns, 8 per thread; neighbouring threads read
    // neighbouring columns of one token
    for (uint e = tid; e < BK * BN; e += 256) {
      const uint lt = e / BK, lk = e % BK;
      const uint t = tok0 + lt, k = k0 + lk;
      xs[lk][lt / 4][lt % 4] = (t < p.n_tokens && k < p.cols) ? x[t * p.x_stride + k] : 0.0;
    }
    barrier();
    for (uint kk = 0; kk < BK; ++kk) {
      const vec4 a = ws[kk][tr], b = xs[kk][tc];
      acc[0] += a.x * b;
      acc[1] += a.y * b;
      acc[2] += a.z * b;
      acc[3] += a.w * b;
    }
    barrier();
  }
  for (uint i = 0; i < 4; ++i) {
    const uint r = row0 + tr * 4 + i;
    if (r >= p.rows) continue;
    for (uint j = 0; j < 4; ++j) {
      const uint t = tok0 + tc * 4 + j;
      if (t < p.n_tokens) {
        const uint at = matmul_dest(r, t);
        y[at] = matmul_store_value(acc[i][j], y[at]);
      }
    }
  }
}
