// Push-constant structs shared verbatim by the C++ host (core/) and the GLSL kernels (shaders/).
// Both sides include this file; the host static_asserts each struct's size (core/kernels/params.h).
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

// matvec / matmul: y[dest(r, t)] (+)= sum_c W[r][c] * x[t][c] for r < rows, t < n_tokens, where
// for global row g = row_begin + r and column c = col_begin + t (shaders/common/matmul_out.glsl):
//   g < seg_row:  dest = c·y_stride + g
//   otherwise:    segment s = (g − seg_row) / seg_len, row i = (g − seg_row) % seg_len within it:
//                 dest = seg_base + s·seg_size + c·seg_stride + i
// so one fused projection (q|k|v rows, gate|up rows) writes each piece to its own buffer region.
// glu (matvec kernels only): 1 SiLU, 2 GELU (tanh form); output row r = act(W[r]·x) · (W[rows + r]·x),
// the binding holding 2·rows weight rows (gate, then up).
struct MatmulParams {
  u32 cols;       // elements per weight row (= x row length)
  u32 rows;       // weight rows in this binding (output rows: half of them with glu)
  u32 row_bytes;  // bytes per weight row
  u32 n_tokens;   // activation rows (1 for matvec)
  u32 x_stride;   // floats between activation rows
  u32 y_stride;   // floats between output rows
  u32 row_begin;  // global row of this binding's first row (a weight split into parts)
  u32 col_begin;  // global column of this dispatch's first activation row
  u32 accumulate; // 1: y += W·x (a residual add folded into the projection), 0: y = W·x
  u32 seg_row;    // first global row of the later segments (0xFFFFFFFF: none)
  u32 seg_len;    // rows per later segment
  u32 seg_base;   // y index of the first later segment's column 0
  u32 seg_size;   // floats between later segments' bases
  u32 seg_stride; // floats between a later segment's columns
  u32 glu;        // 0, or the gated activation of a gate|up projection (1 SiLU, 2 GELU)
  u32 rows_per_group;  // matvec_simd: output rows per workgroup
  u32 x_base;          // matvec_simd_q4_0_x64: x's first element in its buffer, in 16-byte texels
};

// quantize_x: each column t < n_tokens of x ([n_tokens][x_stride] f32, cols a multiple of 32) as
// 8-bit blocks for matvec's integer dot products (MatvecTuning::q8x): at word t·out_stride of the
// output, cols int8 (4 to a word), then one f32 scale per 32-element block; element = q · scale.
struct QuantizeXParams {
  u32 cols;        // elements per column
  u32 n_tokens;    // columns
  u32 x_stride;    // floats between columns of x
  u32 out_stride;  // words between columns of the output
};

// read_ceiling: each invocation XORs per_invocation uvec4 words (< n_words) into out[id]: data[id *
// per_invocation …] (stride 0, CPU drivers) or data[id], data[id + stride], … (GPUs).
struct ReadCeilingParams {
  u32 n_words;         // uvec4 words in the buffer
  u32 per_invocation;  // words one invocation reads
  u32 stride;          // 0: each invocation's words are one run; else the words between its loads
};

// binary: out[i] = a[i] OP b[i % b_period] for i < n (b_period = n: same-shape; = row width:
// a row broadcast, e.g. a bias or a norm weight).
struct BinaryParams {
  u32 n;
  u32 b_period;
};

// rms_norm: out[r] = x[r] / sqrt(mean(x[r]²) + eps) * w, one workgroup per row.
struct NormParams {
  u32 n_rows;
  u32 n_cols;
  u32 x_stride;    // floats between rows of x
  u32 out_stride;  // floats between rows of out
  float eps;
  u32 x_base;      // rms_norm_texel: row 0 of x and of out, in 16-byte texels of their buffers
  u32 out_base;
};

// scale: out[i] = x[i] * s.   swiglu: out[i] = silu(gate[i]) * up[i].
struct ScaleParams {
  u32 n;
  float s;
};

// softmax / argmax: per row of n_cols.
struct RowParams {
  u32 n_rows;
  u32 n_cols;
};

// rope_table: the (cos, sin) of the first n_rot/2 pairs' angles pos · freq_scale · base^(−2i/n_rot)
// / factor[i] for positions 0 … n_pos−1 (Normal: pairs (2i, 2i+1); NeoX: pairs (i, i + n_rot/2)),
// with YaRN's mix when ext_factor > 0.
struct RopeParams {
  u32 n_pos;
  u32 head_dim;
  u32 n_rot;
  float freq_base;
  float freq_scale;
  u32 neox;          // 1: NeoX pairing
  u32 has_factors;   // 1: divide each pair's angle by factors[i]
  float attn_factor; // ggml's mscale: rotated pairs' cos and sin are scaled by it
  u32 pos_first;     // the dispatch's first position (grid y counts from it: a dispatch holds at most 65,535 rows)
  float ext_factor;  // YaRN: > 0 mixes θ·freq_scale with θ by ext_factor · ramp(i) (ggml's rope_yarn)
  float corr_lo;     // the ramp is 1 up to pair corr_lo and 0 from corr_hi (ggml's correction dims)
  float corr_hi;
};

// kv_store: cache[slots[t]] = convert(src[t][0..row_len)) in the cache type; K, then V from src[v_offset].
struct KvStoreParams {
  u32 n_tokens;
  u32 row_len;     // n_head_kv * head_dim
  u32 src_stride;  // floats between rows of src
  u32 v_offset;    // floats from the K rows to the V rows in src
  u32 copy_slots;  // ROT_COPY, kv_rotate: slots of the rotated copy of K (head-major: [n_head_kv][slots][head_dim])
};

// attention: see shaders/attention.comp.
struct AttentionParams {
  u32 n_q;          // query tokens
  u32 n_kv;         // entries of the kv slot list
  u32 n_head;
  u32 n_head_kv;
  u32 head_dim;
  u32 q_stride;     // floats between query tokens (n_head * head_dim for a packed q)
  u32 out_stride;   // floats between output tokens
  u32 n_split;      // KV ranges processed by separate workgroups (1: write the output directly)
  u32 kv_per_split; // slot-list entries per split
  float scale;      // score scale (1 / sqrt(head_dim) unless the model says otherwise)
  // RoPE applied to K as it is read (K is cached un-rotated; see docs/kv-cache.md), with the
  // angles from the rope table
  u32 n_rot;
  u32 neox;
  float attn_factor; // the rope table's scale of rotated pairs (attention_simd's angle steps divide it out)
  float softcap;     // scores s become softcap·tanh(s/softcap) before the softmax; 0: none
  u32 window;        // sliding window: a query at position p sees key positions > p − window; 0: all
  u32 q_first;       // attention_decode: the query token the dispatch's z = 0 is (it takes a group of them)
  u32 rot_split;     // attention_decode with the rotated copy of K: the leading entries whose rows share one
                     // rotation shift (the rest share another); lanes' runs never straddle it. 0 otherwise
  u32 q_base;        // attention_decode's scores pass: 16-byte texels of its q view before query token 0
  u32 kv_slots_base; // attention_decode, attention_lanes: entries of the bound kv_slots, kv_pos and kv_rot texel views
  u32 kv_pos_base;   //   before entry 0 of the list (the views start at their buffers' start)
  u32 kv_rot_base;
  u32 rot_slots;     // attention_decode with the rotated copy of K: its slots (head-major, [n_head_kv][slots][HD])
  u32 per_lane;      // attention_decode: entries per lane of the scores pass (a block; its maxima follow the scores)
  // attention.comp, attention_simd.comp and attention_combine.comp with alone = 1: each query
  // token from q_first on (grid z = token · n_split + split) gets what a pass of it alone gets
  // (see shaders/common/attention_alone.glsl); n_split is then the grid's splits per token.
  u32 alone;
  u32 split_cap;     // alone: the most splits a token's list takes (the scratch it has alone)
  u32 list_align;    // with a window: a query's list starts at its window's first entry rounded down to this
                     // (window_list.glsl: the tiled and simd kernels alone, the decode kernels)
};

// attention.comp's splits of a slot list cover at least this many entries.
#define ATTENTION_SPLIT_MIN_KV 64

#ifdef __cplusplus
}  // namespace vkllm
#else
#undef u32
#undef i32
#endif
#endif
