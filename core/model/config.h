// ModelConfig: a model's hyperparameters, read and validated from GGUF metadata.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "gguf.h"

namespace vkllm {

enum class Arch { Llama, Qwen2, Qwen3, Phi3, Gemma2, Gemma3 };
enum class RopeStyle { Normal, NeoX };  // Normal: pairs (2i, 2i+1); NeoX: pairs (i, i + rot/2)

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;       // general.architecture
  std::string name;            // general.name (may be empty)
  uint32_t n_layer = 0;        // transformer blocks
  uint32_t n_embd = 0;         // residual stream width
  uint32_t n_ff = 0;           // feed-forward hidden width
  uint32_t n_head = 0;         // query heads
  uint32_t n_head_kv = 0;      // key/value heads (grouped-query attention when < n_head)
  uint32_t head_dim = 0;       // per-head width (key_length; n_embd / n_head unless given)
  uint32_t n_vocab = 0;        // tokens in the vocabulary
  uint32_t n_ctx_train = 0;    // context length the model was trained with
  uint32_t n_rot = 0;          // dimensions rotated by RoPE (≤ head_dim)
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor for linear scaling
  RopeStyle rope_style = RopeStyle::Normal;
  float rms_eps = 1e-5f;
  bool qkv_bias = false;       // Q/K/V projections carry biases (qwen2)
  bool qk_norm = false;        // per-head RMSNorm of q and k before RoPE (qwen3: attn_q_norm, attn_k_norm)
  float rope_attn_factor = 1.0f;  // rope.scaling.attn_factor: RoPE's cos and sin are scaled by it (phi3 LongRoPE)
  uint32_t n_ctx_orig = 0;     // rope.scaling.original_context_length (default n_ctx_train): phi3 uses its long
                               // RoPE factors when the context is longer, the short ones otherwise; YaRN's
                               // correction dims are computed from it
  // YaRN (rope.scaling.type yarn, or --rope-scaling yarn; docs/models.md): ext_factor > 0 mixes each
  // pair's interpolated and extrapolated angles. llama.cpp reads no rope.scaling.yarn_* key for these
  // architectures: the values are its defaults unless a --yarn-* flag gives them.
  float yarn_ext_factor = 0.0f;   // 1 with YaRN, else 0
  float yarn_attn_factor = 1.0f;  // --yarn-attn-factor: scales cos and sin where YaRN is off
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  uint32_t n_ctx_orig_yarn = 0;   // YaRN's original context: --yarn-orig-ctx, else n_ctx_orig, else n_ctx_train
  // Gemma 2 / 3 (see docs/models.md)
  float embd_scale = 1.0f;     // token embeddings are multiplied by it (√n_embd)
  float attn_scale = 0.0f;     // query scale; 0: 1/√head_dim
  float attn_softcap = 0.0f;   // scores become c·tanh(s/c) before the softmax; 0: none
  float final_softcap = 0.0f;  // logits likewise
  bool post_norms = false;     // RMSNorm of the attention and FFN outputs before the residual add
  bool gelu_ffn = false;       // GeGLU (tanh GELU of the gate) instead of SwiGLU
  uint32_t n_swa = 0;          // sliding window: a window layer's query sees the n_swa latest positions; 0: none
  uint32_t swa_pattern = 0;    // layer l is a window layer when l % swa_pattern < swa_pattern − 1
  float rope_freq_base_swa = 10000.0f;  // window layers' RoPE (gemma3: 10000 and no scaling)
  float rope_freq_scale_swa = 1.0f;
  std::string tokenizer_model; // tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte BPE)
  bool has_chat_template = false;

  uint32_t n_embd_kv() const { return n_head_kv * head_dim; }  // width of one token's K (or V) row
  bool is_swa(uint32_t layer) const { return n_swa > 0 && swa_pattern > 0 && layer % swa_pattern < swa_pattern - 1; }
  bool has_swa() const { return n_swa > 0 && swa_pattern > 1; }
  // Phi-3's LongRoPE: a cache of n_ctx slots takes the long factors past the original context.
  bool long_rope(uint32_t n_ctx) const { return n_ctx > n_ctx_orig; }
  // The scale of RoPE's cos and sin in the global (or, `swa`, the window) layers, ggml's mscale as
  // llama.cpp sets it. YaRN off: rope.scaling.attn_factor × --yarn-attn-factor. YaRN on: one
  // attention factor for all layers, rope.scaling.attn_factor × (1 + 0.1·ln f for a factor f > 1,
  // else 1) / (1 + 0.1·ln f), which ggml multiplies per layer by 1 + 0.1·ln(1/the layer's scale):
  // so the global layers get rope.scaling.attn_factor × (1 + 0.1·ln f, or 1), and window layers
  // of scale 1 that divided by 1 + 0.1·ln f.
  float rope_mscale(bool swa) const {
    if (yarn_ext_factor <= 0.0f) return rope_attn_factor * yarn_attn_factor;
    const float factor = 1.0f / rope_freq_scale, layer_scale = swa ? rope_freq_scale_swa : rope_freq_scale;
    const float attn = (factor > 1.0f ? 1.0f + 0.1f * std::log(factor) : 1.0f) / (1.0f + 0.1f * std::log(factor)) * rope_attn_factor;
    return attn * (1.0f + 0.1f * std::log(1.0f / layer_scale));
  }
  // The context the model's RoPE is meant for: the trained one, or YaRN's original context times
  // its factor where that is longer (a Qwen2.5 file run with --rope-scaling yarn --rope-scale 4).
  uint32_t n_ctx_rope() const {
    if (yarn_ext_factor <= 0.0f || rope_freq_scale >= 1.0f) return n_ctx_train;
    const double scaled = double(n_ctx_orig_yarn) / rope_freq_scale;
    return scaled > n_ctx_train ? uint32_t(std::min(scaled, 4294967295.0)) : n_ctx_train;
  }
};

// llama.cpp's RoPE flags: what is given replaces the file's value as llama.cpp applies it (the
// window layers of gemma keep the file's RoPE; docs/models.md, "RoPE scaling").
struct RopeOverrides {
  std::string scaling;       // --rope-scaling none|linear|yarn; empty: the file's type
  float freq_base = 0.0f;    // --rope-freq-base; 0: the file's
  float freq_scale = 0.0f;   // --rope-freq-scale, or 1/--rope-scale; 0: the file's (none: 1)
  uint32_t orig_ctx = 0;     // --yarn-orig-ctx; 0: the file's
  float ext_factor = -1.0f;  // --yarn-ext-factor; < 0: 1 for YaRN, 0 for the others
  float attn_factor = -1.0f; // --yarn-attn-factor; < 0: 1
  float beta_fast = -1.0f;   // --yarn-beta-fast; < 0: 32
  float beta_slow = -1.0f;   // --yarn-beta-slow; < 0: 1
};

// Reads the hyperparameters of `f`; throws Error naming the missing or inconsistent key.
ModelConfig read_model_config(const gguf::File& f, const RopeOverrides& rope = {});
// The RoPE that `rope` makes of `f`'s, as a line of text ("yarn, base 1e+06, scale 0.25, …"), or
// empty where it is the file's own (a cache's rows depend on it: model_fingerprint hashes it).
std::string rope_override_summary(const gguf::File& f, const RopeOverrides& rope);
const char* arch_name(Arch a);

}  // namespace vkllm
