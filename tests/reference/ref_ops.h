// Scalar C++ reference implementations of every model op: the ground truth the shaders are tested against.
//
// Plain float code, one element at a time, written for clarity rather than speed. Block layouts
// of the quantized types are exactly ggml's (ggml-common.h); dequantization follows ggml's
// dequantize_row_*; quantize_row_q8_0 / _q4_0 (the KV cache types) match ggml's *_ref versions
// bit for bit, as built by llama.cpp on x86 (multiply-adds fused).
//
// Shape notation: `[a][b] T` is a row-major array of a rows of b elements of type T; the last
// index varies fastest. A "row" of a quantized type is type_bytes(type, n_cols) bytes.
#pragma once
#include <cstdint>

#include "gguf_types.h"
#include "model/config.h"  // vkllm::RopeStyle

namespace vkllm::ref {

// ---- scalar conversions -----------------------------------------------------------------------

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);  // round to nearest even; overflow → ±inf; NaN stays NaN
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even; NaN stays NaN

// ---- rows of any weight type ------------------------------------------------------------------

// Whether dequantize_row / quantize_row handle `t`: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS (whose quantizer is a simple nearest-codebook one,
// not ggml's search).
bool is_supported(gguf::TensorType t);

// src: type_bytes(t, n) bytes → dst: [n] f32. n must be a multiple of the type's block size.
void dequantize_row(gguf::TensorType t, const uint8_t* src, float* dst, int64_t n);

// ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref. src: [n] f32 → dst: type_bytes bytes.
void quantize_row_q8_0(const float* src, uint8_t* dst, int64_t n);
void quantize_row_q4_0(const float* src, uint8_t* dst, int64_t n);

// Any supported type. Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 match ggml's *_ref quantizers exactly; the
// K types use a simple min/max scaling per sub-block (valid blocks, not ggml's bytes).
void quantize_row(gguf::TensorType t, const float* src, uint8_t* dst, int64_t n);

// ---- linear algebra ---------------------------------------------------------------------------

// y = W x. w: [n_rows][n_cols] in type t; x: [n_cols] f32; y: [n_rows] f32.
void matvec(gguf::TensorType t, const uint8_t* w, int64_t n_rows, int64_t n_cols, const float* x, float* y);
// Y = X Wᵀ, the same sums as one matvec per row of X. x: [n_tokens][n_cols] f32;
// y: [n_tokens][n_rows] f32.
void matmul(gguf::TensorType t, const uint8_t* w, int64_t n_rows, int64_t n_cols, const float* x, int64_t n_tokens,
            float* y);
// Y = X Wᵀ for Q4_0 weights the way matvec_simd.comp computes it on CPU drivers: each 32-element
// block of x quantized to ±255 (scale max|x|/255, x·(255/max|x|) rounded to even), Σ (q − 8)·x9
// in integers, times the weight and x scales. Same shapes as matmul.
void matmul_q4_0_x9(const uint8_t* w, int64_t n_rows, int64_t n_cols, const float* x, int64_t n_tokens, float* y);
// Embedding lookup. table: [n_table_rows][n_cols] in type t; ids: [n_ids]; out: [n_ids][n_cols] f32.
void get_rows(gguf::TensorType t, const uint8_t* table, int64_t n_cols, const int32_t* ids, int64_t n_ids, float* out);

// ---- element-wise and row ops (out may alias an input) ----------------------------------------

// out[r][i] = x[r][i] / sqrt(mean_i(x[r][i]²) + eps) * w[i]. x, out: [n_rows][n] f32; w: [n] f32 or
// nullptr for no weight.
void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* out);
void add(const float* a, const float* b, int64_t n, float* out);    // out = a + b, all [n]
void mul(const float* a, const float* b, int64_t n, float* out);    // out = a * b, all [n]
void scale(const float* x, float s, int64_t n, float* out);         // out = s * x, all [n]
// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). All [n].
void swiglu(const float* gate, const float* up, int64_t n, float* out);
// out = gelu(gate) * up with ggml's tanh approximation of GELU, all [n]
void geglu(const float* gate, const float* up, int64_t n, float* out);
// out = cap * tanh(x / cap), all [n]
void softcap(const float* x, float cap, int64_t n, float* out);
// Numerically stable softmax of one row. x, out: [n].
void softmax(const float* x, int64_t n, float* out);
// Index of the largest element (the first one on ties). x: [n], n ≥ 1.
int64_t argmax(const float* x, int64_t n);

// ---- rotary position embedding (ggml_rope_ext, with YaRN when ext_factor > 0) --------------------

struct RopeParams {
  int64_t head_dim = 0;             // elements per head
  int64_t n_rot = 0;                // leading dimensions rotated (even, ≤ head_dim); the rest are copied
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;          // linear scaling: angle = freq_scale * pos * base^(-2i/n_rot)
  const float* freq_factors = nullptr;  // [n_rot / 2] divisors of each pair's angle, or nullptr
  RopeStyle style = RopeStyle::Normal;  // Normal: pairs (2i, 2i+1); NeoX: pairs (i, i + n_rot/2)
  float attn_factor = 1.0f;         // rotated pairs' cos and sin are scaled by it (YaRN's magnitude included)
  // YaRN (the paper's "NTK-by-parts" interpolation with ggml's rounding): with ext_factor > 0 pair
  // k's angle is freq_scale·θ mixed with θ by ext_factor·γ(k), γ 1 for pairs that turn more than
  // beta_fast times over n_ctx_orig positions, 0 for those under beta_slow, linear between (bounds
  // rounded outwards to whole dims).
  float ext_factor = 0.0f;
  int64_t n_ctx_orig = 0;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
};

// Rotates every head of every token. x, out: [n_tokens][n_heads][head_dim] f32 (may alias);
// pos: [n_tokens] positions (may be negative: rotating by -p undoes p).
void rope(const float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, const RopeParams& p, float* out);

// ---- KV cache and attention -------------------------------------------------------------------

// Writes src rows into cache slots. src: [n_rows][row_len] f32; slots: [n_rows];
// cache: [n_slots][type_bytes(t, row_len)] in type t (F32, F16, Q8_0 or Q4_0).
void kv_store(gguf::TensorType t, const float* src, int64_t n_rows, int64_t row_len, const int32_t* slots,
              uint8_t* cache);

struct AttentionShape {
  int64_t n_head = 0;     // query heads
  int64_t n_head_kv = 0;  // key/value heads; query head h reads kv head h / (n_head / n_head_kv)
  int64_t head_dim = 0;
  float scale = 0.0f;    // score scale; 0: 1/sqrt(head_dim)
  float softcap = 0.0f;  // scores s become softcap·tanh(s/softcap) (after the scale); 0: none
  int64_t window = 0;    // a query at p sees positions > p − window only; 0: all
};

// Causal grouped-query attention over a KV cache, softmax(q kᵀ · scale) v per head, f32.
//   q:        [n_q][n_head * head_dim] f32, already rotated
//   q_pos:    [n_q] position of each query token
//   k_cache, v_cache: [n_slots][n_head_kv * head_dim] in kv_type (F32, F16, Q8_0 or Q4_0)
//   slots:    [n_kv] cache rows to consider; slot_pos: [n_kv] the position stored in each
//   out:      [n_q][n_head * head_dim] f32
// Query i attends to the listed slots whose position ≤ q_pos[i] (and > q_pos[i] − window); a query
// with none gets zeros.
void attention(const float* q, const int32_t* q_pos, int64_t n_q, gguf::TensorType kv_type, const uint8_t* k_cache,
               const uint8_t* v_cache, const int32_t* slots, const int32_t* slot_pos, int64_t n_kv,
               const AttentionShape& shape, float* out);

}  // namespace vkllm::ref
