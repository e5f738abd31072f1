// Hyperparameters from GGUF metadata, with the checks that keep later code simple.
#include "model/config.h"

#include <cmath>
#include <cstdio>

#include "base/error.h"

namespace vkllm {
namespace {

// Gemma 2 and 3, as llama.cpp reads them: the window pattern is fixed per architecture (every
// second layer; five of every six), the query scale is 1/√head_dim except for the 27B shapes
// (recognised by their layer count), whose scale is 1/√(n_embd / n_head).
void read_gemma_config(const gguf::File& f, ModelConfig& c) {
  const std::string a = c.arch_name + ".";
  c.embd_scale = std::sqrt(float(c.n_embd));
  const bool is_27b = c.n_layer == (c.arch == Arch::Gemma2 ? 46u : 62u);
  c.attn_scale = 1.0f / std::sqrt(float(is_27b ? c.n_embd / c.n_head : c.head_dim));
  if (c.arch == Arch::Gemma2) {
    c.swa_pattern = 2;
    c.n_swa = f.get_u32_or(a + "attention.sliding_window", 4096);
    c.attn_softcap = f.get_f32_or(a + "attn_logit_softcapping", 50.0f);
    c.final_softcap = f.get_f32_or(a + "final_logit_softcapping", 30.0f);
    c.rope_freq_base_swa = c.rope_freq_base;
    c.rope_freq_scale_swa = c.rope_freq_scale;
  } else {
    c.swa_pattern = 6;
    c.n_swa = f.get_u32(a + "attention.sliding_window");
    c.rope_freq_base_swa = 10000.0f;
    c.rope_freq_scale_swa = 1.0f;
  }
  // Newer converters write the window layers' base (llama.cpp reads it for both).
  c.rope_freq_base_swa = f.get_f32_or(a + "rope.freq_base_swa", c.rope_freq_base_swa);
}

}  // namespace

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Phi3: return "phi3";
    case Arch::Gemma2: return "gemma2";
    case Arch::Gemma3: return "gemma3";
  }
  return "?";
}

ModelConfig read_model_config(const gguf::File& f, const RopeOverrides& rope) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  if (c.arch_name == "llama") {
    c.arch = Arch::Llama;
  } else if (c.arch_name == "qwen2") {
    c.arch = Arch::Qwen2;
    c.rope_style = RopeStyle::NeoX;
    c.qkv_bias = true;
  } else if (c.arch_name == "qwen3") {
    c.arch = Arch::Qwen3;
    c.rope_style = RopeStyle::NeoX;
    c.qk_norm = true;
  } else if (c.arch_name == "phi3") {
    // phi3.attention.sliding_window is ignored, as llama.cpp does (its Phi SWA is disabled).
    c.arch = Arch::Phi3;
    c.rope_style = RopeStyle::NeoX;
  } else if (c.arch_name == "gemma2" || c.arch_name == "gemma3") {
    c.arch = c.arch_name == "gemma2" ? Arch::Gemma2 : Arch::Gemma3;
    c.rope_style = RopeStyle::NeoX;
    c.post_norms = true;
    c.gelu_ffn = true;
    c.qk_norm = c.arch == Arch::Gemma3;
  } else {
    throw Error(f.path() + ": architecture '" + c.arch_name +
                "' is not supported (vkllm runs llama, qwen2, qwen3, phi3, gemma2 and gemma3)");
  }
  const std::string a = c.arch_name + ".";
  c.name = f.get_string_or("general.name", "");
  c.n_layer = f.get_u32(a + "block_count");
  c.n_embd = f.get_u32(a + "embedding_length");
  c.n_ff = f.get_u32(a + "feed_forward_length");
  c.n_head = f.get_u32(a + "attention.head_count");
  c.n_head_kv = f.get_u32_or(a + "attention.head_count_kv", c.n_head);
  c.n_ctx_train = f.get_u32_or(a + "context_length", 2048);
  c.rms_eps = f.get_f32_or(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  c.rope_freq_base = f.get_f32_or(a + "rope.freq_base", 10000.0f);
  // RoPE scaling: linear (a factor with no type is linear: positions are multiplied by 1/factor),
  // YaRN (long-context Qwen2.5/Qwen3 files: the same factor, mixed per pair with the unscaled angle),
  // Phi-3's LongRoPE (factor tensors, model.cpp). Llama 3.1's "llama3" scaling arrives as the
  // rope_freqs tensor. Anything else would run as another model, so it is refused in one line.
  const std::string file_scaling = f.get_string_or(a + "rope.scaling.type", "");
  if (!file_scaling.empty() && file_scaling != "none" && file_scaling != "linear" && file_scaling != "yarn" && file_scaling != "longrope")
    throw Error(f.path() + ": key '" + a + "rope.scaling.type' is '" + file_scaling + "': vkllm implements RoPE scaling 'linear', " +
                "'yarn' and Phi-3's 'longrope', not '" + file_scaling + "'");
  const std::string scaling = rope.scaling.empty() ? file_scaling : rope.scaling;
  // The factor, whatever the type, as llama.cpp reads it (the type in force decides below: none
  // scales nothing, and gemma2's window layers take the file's factor even then).
  float factor = 0.0f;
  if (f.find(a + "rope.scaling.factor"))
    factor = f.get_f32(a + "rope.scaling.factor");
  else if (f.find(a + "rope.scale_linear"))
    factor = f.get_f32(a + "rope.scale_linear");
  if (factor > 0.0f) c.rope_freq_scale = 1.0f / factor;
  c.rope_attn_factor = f.get_f32_or(a + "rope.scaling.attn_factor", 1.0f);
  c.n_ctx_orig = f.get_u32_or(a + "rope.scaling.original_context_length", c.n_ctx_train);
  c.n_ctx_orig_yarn = rope.orig_ctx ? rope.orig_ctx : c.n_ctx_orig ? c.n_ctx_orig : c.n_ctx_train;
  // As llama.cpp's context parameters: the flags, else its defaults (it reads no rope.scaling.yarn_*
  // key for these architectures; measured with the anchor: such keys change nothing there).
  c.yarn_ext_factor = rope.ext_factor >= 0.0f ? rope.ext_factor : scaling == "yarn" ? 1.0f : 0.0f;
  c.yarn_attn_factor = rope.attn_factor >= 0.0f ? rope.attn_factor : 1.0f;
  c.yarn_beta_fast = rope.beta_fast >= 0.0f ? rope.beta_fast : 32.0f;
  c.yarn_beta_slow = rope.beta_slow >= 0.0f ? rope.beta_slow : 1.0f;

  auto bad = [&](const std::string& key, uint64_t value, const std::string& expected) {
    throw Error(f.path() + ": key '" + key + "' is " + std::to_string(value) + ", expected " + expected);
  };
  if (c.n_layer == 0 || c.n_layer > 1024) bad(a + "block_count", c.n_layer, "1..1024");
  if (c.n_embd == 0) bad(a + "embedding_length", c.n_embd, "> 0");
  if (c.n_ff == 0) bad(a + "feed_forward_length", c.n_ff, "> 0");
  // The head width is key_length when the file gives it (qwen3's may differ from n_embd / n_head).
  const bool has_key_length = f.find(a + "attention.key_length") != nullptr;
  if (c.n_ctx_train < 2) bad(a + "context_length", c.n_ctx_train, "at least 2");
  if (c.n_head > 4096) bad(a + "attention.head_count", c.n_head, "at most 4096");
  if (c.n_head == 0 || (!has_key_length && c.n_embd % c.n_head != 0))
    bad(a + "attention.head_count", c.n_head, "a divisor of embedding_length " + std::to_string(c.n_embd));
  if (c.n_head_kv == 0 || c.n_head % c.n_head_kv != 0)
    bad(a + "attention.head_count_kv", c.n_head_kv, "a divisor of head_count " + std::to_string(c.n_head));
  c.head_dim = f.get_u32_or(a + "attention.key_length", c.n_embd / c.n_head);
  if (f.get_u32_or(a + "attention.value_length", c.head_dim) != c.head_dim)
    bad(a + "attention.value_length", f.get_u32(a + "attention.value_length"), "equal to key_length " + std::to_string(c.head_dim));
  // Bounded so that every width below fits 32 bits (a key_length near 2^30 wrapped the KV size to 0).
  if (c.head_dim == 0 || c.head_dim % 2 != 0 || c.head_dim > 1024) bad(a + "attention.key_length", c.head_dim, "an even number up to 1024");
  c.n_rot = f.get_u32_or(a + "rope.dimension_count", c.head_dim);
  // 0 is damage, not a model without RoPE (llama.cpp refuses it for these architectures too).
  if (c.n_rot == 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    bad(a + "rope.dimension_count", c.n_rot, "even, > 0 and ≤ head dim " + std::to_string(c.head_dim));
  // The widths that size the activations, against the tensors', so that a corrupt value is named
  // here and not as an impossible memory plan.
  const auto width_of = [&](const char* tensor, const std::string& key, uint64_t value) {
    if (const gguf::TensorInfo* t = f.find_tensor(tensor); t && t->n_dims >= 1 && t->ne[0] != value)
      bad(key, value, std::to_string(t->ne[0]) + " (the width of tensor '" + tensor + "')");
  };
  width_of("token_embd.weight", a + "embedding_length", c.n_embd);
  width_of("blk.0.ffn_down.weight", a + "feed_forward_length", c.n_ff);
  // Floats that must be finite and positive (a NaN epsilon makes every logit NaN).
  const auto positive = [&](const std::string& key, float value) {
    if (!(std::isfinite(value) && value > 0.0f)) {
      char v[32];
      std::snprintf(v, sizeof v, "%g", double(value));
      throw Error(f.path() + ": key '" + key + "' is " + v + ", expected a finite number > 0");
    }
  };
  positive(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
  positive(a + "rope.freq_base", c.rope_freq_base);
  positive(a + "rope.scaling.attn_factor", c.rope_attn_factor);
  if (factor != 0.0f) positive(a + (f.find(a + "rope.scaling.factor") ? "rope.scaling.factor" : "rope.scale_linear"), factor);

  if (c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3) {
    read_gemma_config(f, c);
    positive(a + "rope.freq_base_swa", c.rope_freq_base_swa);
  }
  // The flags change the global layers' RoPE only (llama.cpp reads the window layers' from the file).
  if (rope.freq_base > 0.0f) c.rope_freq_base = rope.freq_base;
  if (rope.freq_scale > 0.0f) c.rope_freq_scale = rope.freq_scale;
  if (scaling == "none") c.rope_freq_scale = 1.0f;

  c.tokenizer_model = f.get_string_or("tokenizer.ggml.model", "");
  if (f.find("tokenizer.ggml.tokens")) c.n_vocab = static_cast<uint32_t>(f.get_array("tokenizer.ggml.tokens").count);
  if (c.n_vocab == 0) c.n_vocab = f.get_u32_or(a + "vocab_size", 0);
  c.has_chat_template = f.find("tokenizer.chat_template") != nullptr;
  return c;
}

std::string rope_override_summary(const gguf::File& f, const RopeOverrides& rope) {
  const ModelConfig file = read_model_config(f), ours = read_model_config(f, rope);
  // What the rope tables are made of (the window layers' base and scale are the file's whatever the
  // flags; their magnitude under YaRN is not).
  const auto key = [](const ModelConfig& c) {
    char text[240];
    int n = std::snprintf(text, sizeof text, "base %.9g, scale %.9g, mscale %.9g (window layers %.9g)", double(c.rope_freq_base),
                          double(c.rope_freq_scale), double(c.rope_mscale(false)), double(c.rope_mscale(true)));
    if (c.yarn_ext_factor > 0.0f)
      std::snprintf(text + n, sizeof text - size_t(n), ", yarn %.9g from %u, beta %.9g/%.9g", double(c.yarn_ext_factor), c.n_ctx_orig_yarn,
                    double(c.yarn_beta_fast), double(c.yarn_beta_slow));
    return std::string(text);
  };
  return key(file) == key(ours) ? "" : key(ours);
}

}  // namespace vkllm
