// Engine: runs tokens through the model on the device. It owns the KV cache, the activation
// buffers and the command recorder; each prefill chunk or decode step is one command buffer.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/model.h"
#include "kernels/ops.h"
#include "vk/commands.h"
#include "vk/pipeline.h"

namespace vkllm {

struct EngineOptions {
  KvCacheOptions cache;
  uint32_t n_ubatch = 0;    // tokens per prefill chunk (one command buffer each); 0: the device's (default_ubatch)
  bool profile = false;     // collect per-dispatch GPU timings
  AttentionKernel attention = AttentionKernel::Auto;  // which attention kernel (bench compares them)
  bool rotated_k = true;    // keep the rotated copy of K where the CPU drivers' decode kernel reads it (f16 K)
};

// The prefill chunk a device gets unless --ubatch says otherwise: 512 tokens on GPUs, where a
// larger chunk keeps the matmul tiles full; 64 on CPU drivers, where the matmul reads the weights
// once per 4 columns whatever the chunk, so a smaller one costs no speed and frees activation
// memory, shows progress more often and lets the server interleave prompts with decode steps
// (docs/performance.md, "Prefill chunk per device").
uint32_t default_ubatch(const VulkanContext& ctx);

// Which logits a call to decode() returns: the last token's, every token's, or every token's
// log-probabilities (log-softmax of the logits, computed on the device; for perplexity).
enum class LogitsMode { Last, All, AllLogProbs };

// Device memory the engine needs besides the weights, for the memory plan.
struct MemoryPlan {
  uint64_t weights = 0;
  uint64_t kv_cache = 0;
  uint64_t activations = 0;
  // The largest buffer a kernel binds whole (a layer's K or V rows, the RoPE table): it must fit
  // one binding's range, whatever the heap holds.
  uint64_t largest_binding = 0;
  uint64_t total() const { return weights + kv_cache + activations; }
};
MemoryPlan plan_memory(const VulkanContext& ctx, const ModelConfig& c, uint64_t weight_bytes, const EngineOptions& o);

class Engine {
 public:
  Engine(const VulkanContext& ctx, Pipelines& pipelines, const Model& model, const EngineOptions& o);

  // Appends `tokens` to the cache and runs them through the model in chunks of n_ubatch.
  // Returns logits: [1][n_vocab] for the last token, or [n][n_vocab] for every token (All).
  // `progress` is told tokens done / total after each chunk.
  const std::vector<float>& decode(std::span<const int32_t> tokens, LogitsMode mode, const ProgressFn& progress = {});
  const std::vector<float>& logits() const { return logits_; }
  // The most tokens one pass of decode() runs (all_logits: when every token's logits are wanted).
  uint32_t max_chunk(bool all_logits) const;
  // `tokens` (1 … max_chunk(true)) in one pass with every token's logits, [n][n_vocab], each
  // column computed exactly as it would be alone (MatmulKernel::Columns, and attention per query:
  // AttentionShape::per_query): a speculative verify pass, whose logits do not depend on how long
  // the draft was.
  const std::vector<float>& decode_columns(std::span<const int32_t> tokens);
  // Whether decode_columns gives every token exactly the logits a pass of it alone gives, for
  // this model on this device (attention_per_query_exact for its window layers' lists): where it
  // does not, speculation would make the tokens depend on the draft lengths, and is off.
  bool verify_exact() const;
  // One decode step of several sequences in one forward pass: seqs[i]'s tokens (one each, or
  // counts[i] of them: a speculative verify pass of its token and draft) join its cache, in order
  // in `tokens` (seqs[0] is this engine, whose activations and recorder run the pass). The weights
  // are read once for all of them, each sequence attends over its own cache, every matmul keeps
  // each column exactly what it would be alone (MatmulKernel::Columns) and a sequence of several
  // tokens gets attention per query (as decode_columns), so a sequence's logits do not depend on
  // the batch: a step of one sequence runs the same kernels (on GPUs not quite decode's, whose
  // lone column has a matvec specialization of its own). Returns [tokens.size()][n_vocab]. The
  // engines must share the model, the device and the cache capacity (can_batch_with).
  const std::vector<float>& decode_batch(std::span<Engine* const> seqs, std::span<const int32_t> tokens,
                                         std::span<const uint32_t> counts = {});
  bool can_batch_with(const Engine& other) const;
  // Whether decode_batch can run these engines (this one first) with these counts (none: one
  // token each) on this device: the same model and options, rows at bindable offsets, every
  // sequence's tokens within its max_chunk(true), and room for all of them and their logits.
  bool can_decode_batch(std::span<Engine* const> seqs, std::span<const uint32_t> counts = {}) const;
  // The most tokens one decode_batch runs (its rows of activations and of logits).
  uint32_t max_batch_tokens() const { return std::min(opts_.n_ubatch, logits_rows_); }

  KvCache& cache() { return cache_; }
  const KvCache& cache() const { return cache_; }
  const ModelConfig& config() const { return model_.config(); }
  const VulkanContext& context() const { return ctx_; }
  uint32_t ubatch() const { return opts_.n_ubatch; }  // tokens per prefill chunk
  uint64_t activation_bytes() const { return activation_bytes_; }
  // Dispatches and barriers recorded since the engine was made.
  uint64_t dispatches_recorded() const { return rec_.dispatches_recorded(); }
  uint64_t barriers_recorded() const { return rec_.barriers_recorded(); }
  // GPU time of every dispatch since the engine was made (profile on).
  const std::vector<DispatchTiming>& timings() const { return timings_; }

 private:
  // A sequence of a forward pass: the engine whose cache tokens [first, first + n) of the pass join.
  struct Member {
    Engine* seq;
    uint32_t first, n;
  };
  // Records the forward pass of n tokens whose ids/positions are in the upload buffers, each
  // member's slots and lists in its own; logits for rows [out_begin, out_begin + n_out) land in
  // the logits buffer.
  void record_forward(std::span<const Member> members, uint32_t n, uint32_t out_begin, uint32_t n_out, bool log_probs,
                      MatmulKernel kernel);
  // A member's KV store and attention for layer l, on the rows [first, first + n) of the pass's
  // k, v, q and attention buffers.
  void record_kv_store_of(CommandRecorder& rec, uint32_t l, const Engine& pass, uint32_t first, uint32_t n) const;
  void record_attention_of(CommandRecorder& rec, uint32_t l, const Engine& pass, uint32_t first, uint32_t n, bool per_query) const;
  // Whether a pass's members are a decode step (one token each, member i at row i) whose K/V stores
  // and attention the device runs for several sequences per dispatch (record_batch_attention), and
  // those records for layer l (a layer without a sliding window).
  bool batch_step_fits(std::span<const Member> members) const;
  void record_batch_step(std::span<const Member> members, uint32_t l);
  // Appends tokens to the cache and writes their ids, positions, slots and the attention lists to
  // the upload buffers; returns their positions.
  std::vector<int32_t> stage(std::span<const int32_t> tokens);
  void check_tokens(std::span<const int32_t> tokens) const;
  // Records, runs and waits for a forward pass; appends the logits of its last n_out tokens.
  void run_pass(std::span<const Member> members, uint32_t n, uint32_t n_out, bool log_probs,
                MatmulKernel kernel = MatmulKernel::Auto);
  // The first entry of the slot list a window layer's attention reads for a chunk of n tokens.
  uint32_t window_list_start(uint32_t n) const;
  // The granularity of window_list_start: a bound view's offset alignment, in list entries.
  uint32_t list_align() const;
  // The attention of the global layers, or of the sliding-window layers (their window, and the
  // alignment a lone token's window list starts at).
  AttentionShape attention_shape(bool swa) const;
  // The RoPE of the global layers, or of the sliding-window layers (their own base and scale).
  RopeConfig rope_config(bool swa) const;
  // Layer l's rotated copy of K (rows null: none), with `rot` the rotation positions of the slots
  // it goes with; the rope table is the pass engine's.
  RotatedK rotated_k(uint32_t l, const Engine& pass, const BufferView& rot, uint32_t split) const;
  // Records the rebuild of every layer's rotated copy of K, when the cache asks for one (marked
  // done once the pass has run).
  void record_rotated_rebuild(CommandRecorder& rec, const Engine& pass) const;
  // x += w · in, or for models with post-norms x += rms_norm(w · in) · post_norm (through xn).
  void record_residual(const DeviceTensor& w, const BufferView& in, uint32_t in_stride, uint32_t n,
                       const DeviceTensor& post_norm, MatmulKernel kernel);
  // Runs one chunk; appends the logits of its last n_out tokens (0: none).
  void run_chunk(std::span<const int32_t> tokens, uint32_t n_out, bool log_probs);

  const VulkanContext& ctx_;
  const Model& model_;
  EngineOptions opts_;
  KvCache cache_;
  CommandRecorder rec_;
  uint32_t n_kv_listed_ = 0;  // entries in kv_slots/kv_pos for this chunk
  uint32_t n_kv_window_ = 0;  // entries in kv_slots_win/kv_pos_win (window rings) for this chunk
  uint32_t rot_split_ = 0;    // leading entries of kv_rot with one shift (the rotated copy of K)
  bool rope_table_filled_ = false;  // rope_table_ holds every position's angles (after the first step)
  uint32_t logits_rows_;      // rows the logits buffer holds

  // Activations, for up to n_ubatch tokens. [n_ubatch][width] f32 unless noted.
  Buffer x_;         // residual stream [n_embd]
  Buffer xn_;        // normed input / projection output [n_embd]
  Buffer qkv_;       // the q, k and v regions below, one after another (one fused projection fills them)
  BufferView q_;     // queries [n_ubatch][n_head * head_dim]
  BufferView k_, v_; // new keys, values [n_ubatch][n_embd_kv]
  Buffer attn_;      // attention output [n_head * head_dim]
  Buffer ffn_;       // the gate and up regions below, one after another
  BufferView gate_, up_;  // feed-forward [n_ubatch][n_ff]
  Buffer out_rows_;  // rows that produce logits [logits_rows][n_embd]
  Buffer rope_table_;  // [positions][head_dim/2] (cos, sin) of each position's angles: the capacity's,
                       // or twice that with the rotated copy of K (rope_positions_for)
  Buffer rope_table_swa_;  // the same for window layers with their own RoPE base (gemma3), else empty
  Buffer scratch_;   // attention split-KV partials
  // Host-written inputs (upload memory)
  Buffer ids_;       // [n_ubatch] i32 token ids
  Buffer pos_;       // [n_ubatch] i32 positions of the new tokens
  Buffer slots_;     // [n_ubatch] i32 cache slots of the new tokens
  Buffer kv_slots_;  // [capacity] i32 slots attention reads
  Buffer kv_pos_;    // [capacity] i32 their positions
  Buffer rot_;       // [n_ubatch] i32 rotation positions of the new tokens' K rows (rotated copy of K)
  Buffer kv_rot_;    // [capacity] i32 the listed slots' rotation positions (rotated copy of K)
  Buffer slots_win_;     // [n_ubatch] i32 window-ring slots of the new tokens (window rings only)
  Buffer kv_slots_win_;  // [ring slots] i32 window-ring slots the window layers read
  Buffer kv_pos_win_;    // [ring slots] i32 their positions
  Buffer logits_dev_;  // [logits_rows][n_vocab] f32, read back
  uint64_t activation_bytes_ = 0;
  std::vector<float> logits_;
  std::vector<DispatchTiming> timings_;
};

}  // namespace vkllm
