// record_<op>: one function per shader family, recording its dispatches into a CommandRecorder.
// Shapes use the notation of docs/architecture.md: [outer]…[inner] type, innermost contiguous.
// Callers insert rec.barrier() between dependent ops.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kernels/cache_type.h"
#include "vk/commands.h"
#include "kernels/tensor.h"

namespace vkllm {

// The shader variant suffix of a weight type ("q4_k"), or an Error naming the tensor when vkllm
// has no kernel for it.
std::string weight_kernel_suffix(const DeviceTensor& w);
bool weight_type_supported(gguf::TensorType t);

// out[t][0..cols) = dequant(w[ids[t]])      ids [n_tokens] i32 → out [n_tokens][out_stride] f32
void record_get_rows(CommandRecorder& rec, const DeviceTensor& w, const BufferView& ids, uint32_t n_tokens,
                     const BufferView& out, uint32_t out_stride);

// Which weight kernels record_matmul uses. Auto: on CPU drivers matvec_simd.comp, one dispatch per
// group of columns, wherever it applies (docs/shaders.md); elsewhere, and with Portable (which
// tests force to cover it on lavapipe too), matvec.comp for one token (and for up to
// k_matvec_chunk where the tuning's cols > 1: on GPUs) and the tiled matmul.comp for more.
// Columns: as Auto, but never the tiled matmul (matvec.comp with the tuning's cols per workgroup,
// whatever the count), so that every column's result is what it is in any other batch: the
// server's decode steps, whose tokens must not depend on the batch. PortableGpu: Portable tuned as
// on a GPU whatever the device (matvec.comp under MatvecTuning), so tests cover that tuning on lavapipe.
enum class MatmulKernel { Auto, Portable, Columns, PortableGpu };

// How matvec.comp spreads a matrix over a GPU: invocations per workgroup, pieces in flight per
// invocation, rows per subgroup at a time (sharing each piece's loads of x), and subgroups per row
// group (splitting each row's pieces; their sums meet in shared memory); q8x: Q4_0, Q4_1, Q8_0,
// Q4_K, Q5_K and Q6_K weights read x as 8-bit blocks (quantize_x.comp, one dispatch before the
// matvec) through integer dot products where the device has them (DeviceInfo::int_dot), as
// llama.cpp's decode does; off until a GPU measures it (docs/performance.md); cols: the columns a
// workgroup multiplies each piece of the weights into (MatmulKernel::Columns, and prompt chunks of
// up to k_matvec_chunk tokens, which take matvec instead of the tiled matmul when cols > 1; a lone
// decode step always takes one). CPU drivers take {64, 1, 1, 1, 0, 1}; GPUs the default below (the
// first four the best of 17 tunings swept on an H200, docs/performance.md), or the environment's
// VKLLM_MATVEC="wg=256,in_flight=2,rps=2,split=4,q8x=1,cols=1" (any of the six; the benchmark's
// sweeps, scripts/bench-gpu.sh tune).
struct MatvecTuning {
  uint32_t wg = 128, in_flight = 2, rps = 1, split = 2, q8x = 0, cols = 4;
  bool operator==(const MatvecTuning&) const = default;
};
// Prompt chunks of at most this many tokens take matvec.comp on GPUs (MatvecTuning::cols > 1).
constexpr uint32_t k_matvec_chunk = 8;
// "wg=…,in_flight=…,rps=…,split=…,q8x=…,cols=…" over `base`, or an Error naming the part that is
// wrong (wg: a power of two from 32 to 1,024; in_flight: 1, 2, 4 or 8; rps: 1 to 4; split: a power
// of two up to 32; q8x: 0 or 1; cols: 1, 2, 4 or 8).
MatvecTuning parse_matvec_tuning(std::string_view text, MatvecTuning base = {});
// The tuning record_matmul gives matvec.comp on `ctx` for `kernel` (PortableGpu: the GPU tuning).
MatvecTuning matvec_tuning(const VulkanContext& ctx, MatmulKernel kernel);
// Tests: the GPU tuning from now on (nullopt: the default or VKLLM_MATVEC again).
void set_matvec_tuning(std::optional<MatvecTuning> t);

// Overwrite: y = w·x; Accumulate: y += w·x (a residual add folded into the projection).
enum class MatmulStore { Overwrite, Accumulate };

// y[t][r] (+)= w[r] · x[t]    x [n_tokens][x_stride] f32 → y [n_tokens][y_stride] f32, r < w.rows.
void record_matmul(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                   uint32_t n_tokens, const BufferView& y, uint32_t y_stride, MatmulStore store = MatmulStore::Overwrite,
                   MatmulKernel kernel = MatmulKernel::Auto);

// Which matvec kernels a run takes: for one column (a decode step of one sequence) and for a group
// of columns (prefill chunks, a step of several sequences). A streamed perplexity takes only
// single columns.
struct MatmulUse {
  bool one_column = true;
  bool columns = true;
};
// The pipelines record_matmul (MatmulKernel::Auto) takes for a weight of `type` with rows of `cols`
// elements, for several tokens and for one (as `use` says), the costlier first: for
// Pipelines::prepare before the weights are uploaded. Only CPU drivers' matvec_simd, whose kernels
// take lavapipe seconds each to create in every process (docs/performance.md, "Start-up");
// elsewhere none.
std::vector<PipelineSpec> matmul_pipelines(const VulkanContext& ctx, gguf::TensorType type, uint64_t cols, MatmulUse use = {});

// A fused projection (q|k|v rows in one weight): its first rows[0] rows to outs[0] as
// [n_tokens][rows[0]], the next rows[1] to outs[1] as [n_tokens][rows[1]], and so on, in one
// dispatch per weight part. The pieces after the first have equal row counts, and their outputs lie
// after outs[0] in the same buffer.
void record_matmul_split(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                         uint32_t n_tokens, std::span<const BufferView> outs, std::span<const uint32_t> rows,
                         MatmulKernel kernel = MatmulKernel::Auto);

// The gated activation of a feed-forward block.
enum class Glu : uint32_t { SiLU = 1, GELU = 2 };

// out[t][r] = act(w[r]·x[t]) · (w[n + r]·x[t]), r < n = w.rows / 2, for a fused gate|up weight (gate
// rows, then up rows, in one binding). Where a matvec kernel serves the tokens it is one dispatch;
// elsewhere gate and up are written to `gate` and `up` ([n_tokens][n] each, up after gate in one
// buffer), then swiglu / geglu writes `out` (which may be `gate`).
void record_matmul_glu(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                       uint32_t n_tokens, const BufferView& gate, const BufferView& up, const BufferView& out, Glu act,
                       MatmulKernel kernel = MatmulKernel::Auto);

// The read ceiling of `bench --ops`: streams `data` (a multiple of 16 bytes) with uvec4 loads,
// XOR-folding each invocation's words into out [read_ceiling_out_bytes / 4] u32: on CPU drivers a
// 4 KiB run per invocation, on GPUs 16 words strided by the invocations (a subgroup's loads
// coalesced). `texel`: the loads are texel loads of a storage texel buffer (as the CPU-driver
// kernels read), else storage-buffer loads. `strided` overrides the device's layout (tests).
void record_read_ceiling(CommandRecorder& rec, const BufferView& data, const BufferView& out, bool texel,
                         std::optional<bool> strided = {});
uint64_t read_ceiling_out_bytes(const VulkanContext& ctx, uint64_t data_bytes, std::optional<bool> strided = {});

// ---- element-wise and row ops (out may alias an input) -----------------------------------------

// out[i] = a[i] + b[i % b_period], i < n.   a, out [n] f32; b [b_period] f32
void record_add(CommandRecorder& rec, const BufferView& a, const BufferView& b, const BufferView& out, uint32_t n,
                uint32_t b_period);
// out[i] = a[i] * b[i % b_period]
void record_mul(CommandRecorder& rec, const BufferView& a, const BufferView& b, const BufferView& out, uint32_t n,
                uint32_t b_period);
// out[i] = x[i] * s
void record_scale(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n, float s);
// out[i] = silu(gate[i]) * up[i]
void record_swiglu(CommandRecorder& rec, const BufferView& gate, const BufferView& up, const BufferView& out, uint32_t n);
// out[i] = gelu(gate[i]) * up[i], GELU's tanh approximation
void record_geglu(CommandRecorder& rec, const BufferView& gate, const BufferView& up, const BufferView& out, uint32_t n);
// out[i] = act(gate[i]) * up[i]: record_swiglu or record_geglu.
void record_glu(CommandRecorder& rec, Glu act, const BufferView& gate, const BufferView& up, const BufferView& out, uint32_t n);
// out[i] = cap * tanh(x[i] / cap)   (Gemma 2's logit soft-capping)
void record_softcap(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n, float cap);
// out[r] = x[r] / sqrt(mean(x[r]²) + eps) * w.   x [n_rows][x_stride], w [n_cols], out [n_rows][out_stride] f32
void record_rms_norm(CommandRecorder& rec, const BufferView& x, uint32_t x_stride, const BufferView& w, const BufferView& out,
                     uint32_t out_stride, uint32_t n_rows, uint32_t n_cols, float eps);
// Row-wise softmax: x, out [n_rows][n_cols] f32.
void record_softmax(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n_rows, uint32_t n_cols);
// Row-wise log-softmax: x, out [n_rows][n_cols] f32 (may alias).
void record_log_softmax(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n_rows, uint32_t n_cols);
// Row-wise argmax (first index of the maximum): x [n_rows][n_cols] f32 → out [n_rows] i32.
void record_argmax(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n_rows, uint32_t n_cols);

// ---- rotary position embedding, KV cache and attention ------------------------------------------

struct RopeConfig {
  uint32_t head_dim = 0;
  uint32_t n_rot = 0;            // leading dims rotated (even, ≤ head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  bool neox = false;             // NeoX pairing (i, i + n_rot/2); else (2i, 2i+1)
  BufferView factors;            // [n_rot/2] f32 per-pair frequency divisors; buffer null for none
  // ggml's mscale: the rotated pairs' cos and sin are scaled by it (the pairs past n_rot are not),
  // in the rope table, so q and K both. YaRN's magnitude term included (ModelConfig::rope_mscale).
  float attn_factor = 1.0f;
  // YaRN (ggml's rope_yarn) when ext_factor > 0: pair i's angle mixes the scaled θ·freq_scale with
  // the unscaled θ by ext_factor times a ramp falling from 1 to 0 across ggml's correction dims (from
  // n_ctx_orig, beta_fast and beta_slow).
  float ext_factor = 0.0f;
  uint32_t n_ctx_orig = 0;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
};

// The cos/sin of every pair angle for positions 0..n_pos-1: table [n_pos][head_dim/2] vec2 f32.
void record_rope_table(CommandRecorder& rec, const BufferView& table, uint32_t n_pos, const RopeConfig& rope);

// cache[slots[t]] = convert(src[t]).  src [n_tokens][src_stride] f32, slots [n_tokens] i32,
// cache [n_slots][cache_row_bytes(type, row_len)].
void record_kv_store(CommandRecorder& rec, CacheType type, const BufferView& src, uint32_t src_stride,
                     const BufferView& slots, uint32_t n_tokens, uint32_t row_len, const BufferView& cache);
// The rotated copy of K (f16 K caches on CPU drivers; docs/kv-cache.md, "The rotated copy of K"):
// each slot's K row rotated by RoPE at a position of its own, so that the decode kernel runs no
// RoPE per cached token. `rows` null: no copy.
struct RotatedK {
  BufferView rows;        // [n_head_kv][n_slots][head_dim] f16 (head-major), the slots of the K cache
  BufferView rot;         // i32: the position each token's row is (to be) rotated at, in the order
                          // of the slot list it goes with
  BufferView rope_table;  // record_rope_table's, covering every position in rot
  RopeConfig rope;
  uint32_t split = 0;     // attention: the leading listed entries whose rot − pos is one value
                          // (the rest share another)
};
// The K and the V rows of the same tokens, in one dispatch where the two caches have one type and
// v_src follows k_src in its buffer (else two); with `rotated`, K also into the rotated copy
// (f16 K only), at the positions rotated.rot lists per token.
void record_kv_store_pair(CommandRecorder& rec, CacheType type_k, CacheType type_v, const BufferView& k_src,
                          const BufferView& v_src, uint32_t src_stride, const BufferView& slots, uint32_t n_tokens,
                          uint32_t row_len, const BufferView& k_cache, const BufferView& v_cache, const RotatedK& rotated = {});
// Rebuilds the rotated copy's rows of the n slots listed from the f16 K cache, each rotated at
// its rotated.rot entry (bit for bit what kv_store writes).
void record_kv_rotate(CommandRecorder& rec, const BufferView& k_cache, const BufferView& slots, uint32_t n, uint32_t row_len,
                      const RotatedK& rotated);

// attention.comp (shared-memory tiles: GPUs), attention_simd.comp or attention_lanes.comp (CPU
// drivers: a lane per slot, or per query row for lists under 256 slots); Auto picks by device
// type and list length, tests force each.
enum class AttentionKernel { Auto, Tiled, Simd, Lanes };

struct AttentionShape {
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;
  AttentionKernel kernel = AttentionKernel::Auto;
  float scale = 0.0f;    // score scale; 0: 1/√head_dim
  float softcap = 0.0f;  // scores become softcap·tanh(s/softcap) before the softmax; 0: none
  uint32_t window = 0;   // sliding window: a query at p sees positions > p − window only; 0: none
  // Every query token of the pass gets exactly the floats a pass of that token alone gets (a
  // speculative verify pass; a pass of one token always does). Passes of one token and these run
  // the list kernels' "alone" layout (common/attention_alone.glsl).
  bool per_query = false;
  // With a window: a lone token's list starts at its window's first position rounded down to
  // list_align (window_list_first; the engine's: a bound view's offset alignment, or 1 for a
  // window ring's list), and so do the decode kernels' queries; list_pos0 is the position of the
  // list's entry 0 (positions are logical indices there).
  uint32_t list_align = 1;
  uint32_t list_pos0 = 0;
};

// Why a forced kernel (--attention simd|lanes) cannot run this head dim and rotation on this
// device, as one sentence; empty where it can (tiled and auto always can).
std::string attention_kernel_misfit(const VulkanContext& ctx, AttentionKernel kernel, uint32_t head_dim, uint32_t n_rot);
// Scratch floats record_attention needs for a decode step over up to max_kv slots (split-KV
// partials, or the scores of attention_decode.comp on CPU drivers), with room for the scores of
// `queries` query tokens at once (a prefill chunk over a long cached prefix runs in groups of
// that many on CPU drivers) and the partials of `alone` tokens of a per_query pass at once (it
// runs in groups of as many).
uint64_t attention_scratch_floats(const AttentionShape& shape, uint32_t max_kv, uint32_t queries = 1, uint32_t alone = 1);
// Whether record_attention runs attention_decode.comp for this shape on this device for some list
// of up to max_kv slots (it takes lists of ≥ 256): what a rotated copy of K (RotatedK) serves.
bool decode_kernels_fit(const VulkanContext& ctx, const AttentionShape& shape, uint32_t max_kv);
// Whether record_attention can give every query of a per_query pass exactly the floats a pass of
// that token alone gets, for this shape on this device: everywhere but a window just under 256
// slots whose lone lists (window to window + list_align − 1 entries) reach 256 where the kernel a
// CPU driver takes changes there: a pass's tokens would take one kernel, another, then the first.
bool attention_per_query_exact(const VulkanContext& ctx, const AttentionShape& shape, uint32_t n_rot);
// The first position of a query at `pos`'s list under a window, rounded down to `align`: where
// the engine starts a token's window list, and where a per_query pass's token starts its own
// (common/window_list.glsl); 0 without a window or before it.
uint32_t window_list_first(uint32_t pos, uint32_t window, uint32_t align);
// The part of that which depends on the shape alone (not the device), for `vkllm info`.
bool decode_shape_fits(const AttentionShape& shape, uint32_t max_kv);
// Whether the rotated copy's rope table for a cache of `capacity` slots (two positions a slot) is
// filled by one dispatch, a workgroup row per position, on a grid `max_grid_height` rows high
// (maxComputeWorkGroupCount[1]; lavapipe's is the Vulkan minimum, k_min_grid_height).
constexpr uint32_t k_min_grid_height = 65535;
bool rotated_copy_table_fits(uint32_t capacity, uint32_t max_grid_height);
// The query group an engine sizes its scratch for: up to 64 query tokens within 64 MiB of
// scores on CPU drivers, 1 elsewhere (GPUs take the tiled kernel for prefill).
uint32_t attention_query_group(const VulkanContext& ctx, const AttentionShape& shape, uint32_t max_kv);
// The tokens of a per_query pass an engine sizes its scratch's split-KV partials for: 16 on GPUs
// (a verify pass's tokens), 1 on CPU drivers (whose verify passes mostly take the lanes and decode
// kernels, which need no partials).
uint32_t attention_alone_group(const VulkanContext& ctx);

// Causal grouped-query attention of n_q query tokens over the n_kv cache slots listed in
// kv_slots (with their positions kv_pos), soft-capped and windowed as `shape` says; K is rotated
// at kv_pos as it is read, with the angles of `rope_table` (record_rope_table, covering every
// position in kv_pos).
//   q [n_q][q_stride] f32 rotated, q_pos [n_q] i32, k/v cache [n_slots][row bytes] in `type`,
//   out [n_q][out_stride] f32, scratch ≥ attention_scratch_floats(shape, n_kv) f32 (split KV, decode).
// `rotated` (rot: [n_kv], the list's entries): attention_decode.comp reads K from the copy instead.
void record_attention(CommandRecorder& rec, CacheType type, const AttentionShape& shape, const RopeConfig& rope,
                      const BufferView& rope_table,
                      const BufferView& q, uint32_t q_stride, const BufferView& q_pos, uint32_t n_q,
                      const BufferView& k_cache, const BufferView& v_cache, const BufferView& kv_slots,
                      const BufferView& kv_pos, uint32_t n_kv, const BufferView& out, uint32_t out_stride,
                      const BufferView& scratch, const RotatedK& rotated = {});

// One decode step of several sequences, each one query token over its own f16 cache (a server's
// batched step): the K/V stores of up to k_batch_seqs of them in one dispatch, and their attention
// (attention_lanes.comp) in another, instead of one of each per sequence (docs/server.md, "One
// dispatch for every sequence"). Each does exactly what record_kv_store_pair and record_attention
// do for that sequence alone, bit for bit.
constexpr uint32_t k_batch_seqs = 4;
struct SeqAttention {
  BufferView slots;              // [1] i32: the cache slot of the new token's K and V
  BufferView q_pos;              // [1] i32: its position
  BufferView k_cache, v_cache;   // f16 [n_slots][row bytes]
  BufferView kv_slots, kv_pos;   // the slot list attention reads, and its positions
  uint32_t n_kv = 0;
  RotatedK rotated;              // as record_kv_store_pair's (rot: [1]); rows null: none (for every sequence)
};
// Whether the batched records serve these: a device with arrays of bindings (and room for their
// descriptors), f16 K and V, and lists of at most max_n_kv slots that the kernel choice gives to
// attention_lanes.comp (on CPU drivers, under 256 slots; anywhere, when it is forced).
bool batch_attention_fits(const VulkanContext& ctx, CacheType type_k, CacheType type_v, const AttentionShape& shape,
                          const RopeConfig& rope, uint32_t max_n_kv);
// Row i of k_src and v_src (v_src after k_src in one buffer) is the new token of seqs[i].
void record_batch_kv_store(CommandRecorder& rec, const BufferView& k_src, const BufferView& v_src, uint32_t src_stride,
                           uint32_t row_len, std::span<const SeqAttention> seqs);
// Row i of q (un-rotated) and of out is seqs[i]'s query token.
void record_batch_attention(CommandRecorder& rec, const AttentionShape& shape, const RopeConfig& rope, const BufferView& rope_table,
                            const BufferView& q, uint32_t q_stride, const BufferView& out, uint32_t out_stride,
                            std::span<const SeqAttention> seqs);

}  // namespace vkllm
