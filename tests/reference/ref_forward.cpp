// Reference forward pass: embed, per layer attention and SwiGLU feed-forward with residuals, final norm, logits.
#include "ref_forward.h"

#include <string>

#include "model/config.h"
#include "ref_ops.h"

namespace vkllm::ref {

namespace {

using gguf::TensorType;

const gguf::TensorInfo& tensor(const gguf::File& f, const std::string& name) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw gguf::Error(f.path() + ": tensor '" + name + "' is missing");
  return *t;
}

// y = x Wᵀ for W [ne1][ne0]: x [n_tokens][ne0] f32 → [n_tokens][ne1] f32.
std::vector<float> linear(const gguf::TensorInfo& w, const std::vector<float>& x, int64_t n_tokens) {
  std::vector<float> y(static_cast<size_t>(n_tokens) * w.ne[1]);
  matmul(w.type, w.data, static_cast<int64_t>(w.ne[1]), static_cast<int64_t>(w.ne[0]), x.data(), n_tokens, y.data());
  return y;
}

// Adds an F32 bias [n] to every row of x [n_tokens][n].
void add_bias(const gguf::TensorInfo& b, std::vector<float>& x, int64_t n_tokens) {
  const int64_t n = static_cast<int64_t>(b.ne[0]);
  const float* bias = reinterpret_cast<const float*>(b.data);
  for (int64_t t = 0; t < n_tokens; ++t) add(x.data() + t * n, bias, n, x.data() + t * n);
}

const float* f32_data(const gguf::TensorInfo& t) { return reinterpret_cast<const float*>(t.data); }

}  // namespace

std::vector<float> forward(const gguf::File& f, std::span<const int32_t> tokens, TensorType kv_type) {
  const ModelConfig c = read_model_config(f);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_embd = c.n_embd, n_q = int64_t{c.n_head} * c.head_dim, n_kv = c.n_embd_kv();

  RopeParams rp;
  rp.head_dim = c.head_dim;
  rp.n_rot = c.n_rot;
  rp.freq_base = c.rope_freq_base;
  rp.freq_scale = c.rope_freq_scale;
  rp.style = c.rope_style;
  rp.attn_factor = c.rope_mscale(false);
  rp.ext_factor = c.yarn_ext_factor;
  rp.n_ctx_orig = c.n_ctx_orig_yarn;
  rp.beta_fast = c.yarn_beta_fast;
  rp.beta_slow = c.yarn_beta_slow;
  if (const gguf::TensorInfo* ff = f.find_tensor("rope_freqs.weight")) rp.freq_factors = f32_data(*ff);
  const AttentionShape shape{c.n_head, c.n_head_kv, c.head_dim};

  std::vector<int32_t> pos(static_cast<size_t>(n));  // [n] positions, also the cache slots
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const size_t kv_row_bytes = gguf::type_bytes(kv_type, static_cast<uint64_t>(n_kv));
  std::vector<uint8_t> k_cache(static_cast<size_t>(n) * kv_row_bytes), v_cache(k_cache.size());  // [n][n_kv] kv_type

  // x: the residual stream [n][n_embd] f32.
  const gguf::TensorInfo& tok_embd = tensor(f, "token_embd.weight");
  std::vector<float> x(static_cast<size_t>(n * n_embd)), h(x.size());
  get_rows(tok_embd.type, tok_embd.data, n_embd, tokens.data(), n, x.data());

  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    // Attention: norm, Q/K/V projections (+ biases), RoPE, cache store, attention, output + residual.
    rms_norm(x.data(), f32_data(tensor(f, p + "attn_norm.weight")), n, n_embd, c.rms_eps, h.data());
    std::vector<float> q = linear(tensor(f, p + "attn_q.weight"), h, n);  // [n][n_head * head_dim]
    std::vector<float> k = linear(tensor(f, p + "attn_k.weight"), h, n);  // [n][n_head_kv * head_dim]
    std::vector<float> v = linear(tensor(f, p + "attn_v.weight"), h, n);  // [n][n_head_kv * head_dim]
    if (c.qkv_bias) {
      add_bias(tensor(f, p + "attn_q.bias"), q, n);
      add_bias(tensor(f, p + "attn_k.bias"), k, n);
      add_bias(tensor(f, p + "attn_v.bias"), v, n);
    }
    rope(q.data(), pos.data(), n, c.n_head, rp, q.data());
    rope(k.data(), pos.data(), n, c.n_head_kv, rp, k.data());
    kv_store(kv_type, k.data(), n, n_kv, pos.data(), k_cache.data());
    kv_store(kv_type, v.data(), n, n_kv, pos.data(), v_cache.data());
    std::vector<float> attn(static_cast<size_t>(n * n_q));  // [n][n_head * head_dim]
    attention(q.data(), pos.data(), n, kv_type, k_cache.data(), v_cache.data(), pos.data(), pos.data(), n, shape,
              attn.data());
    const std::vector<float> o = linear(tensor(f, p + "attn_output.weight"), attn, n);  // [n][n_embd]
    add(x.data(), o.data(), n * n_embd, x.data());

    // Feed-forward: norm, gate and up, SwiGLU, down + residual.
    rms_norm(x.data(), f32_data(tensor(f, p + "ffn_norm.weight")), n, n_embd, c.rms_eps, h.data());
    std::vector<float> gate = linear(tensor(f, p + "ffn_gate.weight"), h, n);  // [n][n_ff]
    const std::vector<float> up = linear(tensor(f, p + "ffn_up.weight"), h, n);
    swiglu(gate.data(), up.data(), static_cast<int64_t>(gate.size()), gate.data());
    const std::vector<float> down = linear(tensor(f, p + "ffn_down.weight"), gate, n);  // [n][n_embd]
    add(x.data(), down.data(), n * n_embd, x.data());
  }

  // Final norm and logits; tied models reuse token_embd as the output matrix.
  rms_norm(x.data(), f32_data(tensor(f, "output_norm.weight")), n, n_embd, c.rms_eps, h.data());
  const gguf::TensorInfo* out = f.find_tensor("output.weight");
  return linear(out ? *out : tok_embd, h, n);  // [n][n_vocab]
}

}  // namespace vkllm::ref
