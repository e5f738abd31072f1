// Model: a GGUF model's configuration and its weights in device memory, bound by one table of
// tensor names with expected shapes and types.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gguf.h"
#include "model/config.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "vk/pipeline.h"

namespace vkllm {

// Shapes are written as GGUF's ne: [cols, rows] with cols = elements per row. Fused tensors of
// the file (phi3's attn_qkv and gate|up ffn_up) are split by rows into these at upload.
struct LayerWeights {
  DeviceTensor attn_norm;  // [n_embd] f32
  DeviceTensor wq;         // [n_embd, n_head * head_dim]
  DeviceTensor wk;         // [n_embd, n_head_kv * head_dim]
  DeviceTensor wv;         // [n_embd, n_head_kv * head_dim]
  DeviceTensor wo;         // [n_head * head_dim, n_embd]
  DeviceTensor bq, bk, bv; // [n_head * head_dim], [n_embd_kv], [n_embd_kv] f32 (qwen2 only)
  DeviceTensor q_norm, k_norm;  // [head_dim] f32, applied to every head of q and k (qwen3 only)
  DeviceTensor attn_post_norm;  // [n_embd] f32, the attention output's norm (gemma2/3 only)
  DeviceTensor ffn_norm;   // [n_embd] f32
  DeviceTensor ffn_post_norm;   // [n_embd] f32, the FFN output's norm (gemma2/3 only)
  DeviceTensor w_gate;     // [n_embd, n_ff]
  DeviceTensor w_up;       // [n_embd, n_ff]
  DeviceTensor w_down;     // [n_ff, n_embd]
  // Fused at upload where the pieces allow (kernels/tensor.h upload_fused), else empty (no parts):
  // wq, wk and wv are then views of wqkv's rows, w_gate and w_up of w_gate_up's.
  DeviceTensor wqkv;       // [n_embd, n_head * head_dim + 2 * n_embd_kv]
  DeviceTensor w_gate_up;  // [n_embd, 2 * n_ff]
};

struct Weights {
  DeviceTensor tok_embd;     // [n_embd, n_vocab]
  DeviceTensor output_norm;  // [n_embd] f32
  DeviceTensor output;       // [n_embd, n_vocab]; the token embedding when the model ties them
  std::optional<DeviceTensor> rope_freqs;  // [n_rot / 2] f32 per-pair frequency divisors (Llama 3.1+)
  std::optional<DeviceTensor> rope_long, rope_short;  // phi3 LongRoPE divisors for long / short contexts
  std::vector<LayerWeights> layers;
  bool tied_output = false;
};

// Progress of a long operation: done and total in the operation's own unit (bytes for loading).
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

class Model {
 public:
  // Validates every tensor against the table (name, type, shape; expected vs actual on mismatch)
  // before uploading anything, then uploads the weights. With `prepare`, the pipelines the weights'
  // projections take (those `use` names) are started there first (Pipelines::prepare), so that making
  // them overlaps the upload.
  Model(const VulkanContext& ctx, const gguf::File& file, const ProgressFn& progress = {}, Pipelines* prepare = nullptr,
        MatmulUse use = {}, const RopeOverrides& rope = {});

  const ModelConfig& config() const { return config_; }
  const Weights& weights() const { return weights_; }
  const gguf::File& file() const { return file_; }
  uint64_t weight_bytes() const { return arena_.bytes_allocated(); }
  // The per-pair RoPE frequency divisors for a cache of `n_ctx` tokens, as llama.cpp chooses them
  // (rope_freqs; else phi3's long factors when n_ctx exceeds the original context, its short ones
  // otherwise), or nullptr.
  const DeviceTensor* rope_factors(uint32_t n_ctx) const;

 private:
  const gguf::File& file_;
  ModelConfig config_;
  WeightArena arena_;
  Weights weights_;
};

// Bytes the weights will take on the device, without uploading (for the memory plan).
uint64_t model_weight_bytes(const gguf::File& file);

}  // namespace vkllm
