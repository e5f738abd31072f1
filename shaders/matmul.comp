// matmul: y[dest(r, t)] (+)= W[r] · X[t] for many activation rows (prefill; dest and its segments: common/matmul_out.glsl, no glu). A workgroup of 256
// computes a 64-row × 32-token tile, stepping through the columns 32 at a time with the weight
// tile dequantized into shared memory; each thread owns 4 rows × 2 tokens.
// Bindings: 0 W [rows][row_bytes] (weight type), 1 X [n_tokens][x_stride] f32, 2 Y [n_tokens][y_stride] f32.
#version 450
#extension GL_GOOGLE_include_directive : require
#define WEIGHT_BINDING 0
#include "dequant.glsl"
#include "params.h"

#define BM 64
#define BN 32
#define BK 32
#define TM 4
#define TN 2

layout(local_size_x = 256) in;
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { MatmulParams p; };
#include "matmul_out.glsl"

shared float ws[BK][BM + 1];  // [k][row]
shared float xs[BK][BN + 1];  // [k][token]

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint row0 = gl_WorkGroupID.x * BM;
  const uint tok0 = gl_WorkGroupID.y * BN;
  const uint tr = tid % (BM / TM);  // this thread's rows: row0 + tr*TM …
  const uint tc = tid / (BM / TM);  // this thread's tokens: tok0 + tc*TN …
  float acc[TM][TN];
  for (uint i = 0; i < TM; ++i)
    for (uint j = 0; j < TN; ++j) acc[i][j] = 0.0;

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
      for (uint i = 0; i < 8; ++i) ws[lk + i][lr] = v[i];
    }
    for (uint e = tid; e < BK * BN; e += 256) {  // activation tile
      const uint lt = e / BK, lk = e % BK;
      const uint t = tok0 + lt, k = k0 + lk;
      xs[lk][lt] = (t < p.n_tokens && k < p.cols) ? x[t * p.x_stride + k] : 0.0;
    }
    barrier();
    for (uint kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
      for (uint i = 0; i < TM; ++i) a[i] = ws[kk][tr * TM + i];
      for (uint j = 0; j < TN; ++j) b[j] = xs[kk][tc * TN + j];
      for (uint i = 0; i < TM; ++i)
        for (uint j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    barrier();
  }
  for (uint i = 0; i < TM; ++i) {
    const uint r = row0 + tr * TM + i;
    if (r >= p.rows) continue;
    for (uint j = 0; j < TN; ++j) {
      const uint t = tok0 + tc * TN + j;
      if (t < p.n_tokens) {
        const uint at = matmul_dest(r, t);
        y[at] = matmul_store_value(acc[i][j], y[at]);
      }
    }
  }
}
