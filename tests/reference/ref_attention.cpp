// Reference KV cache store and causal grouped-query attention over cache slots.
#include <cmath>
#include <stdexcept>
#include <vector>

#include "ref_ops.h"

namespace vkllm::ref {

using gguf::TensorType;

namespace {

void check_kv_type(TensorType t) {
  if (t != TensorType::F32 && t != TensorType::F16 && t != TensorType::Q8_0 && t != TensorType::Q4_0)
    throw std::invalid_argument("ref: KV cache type must be F32, F16, Q8_0 or Q4_0, not " + gguf::type_name(t));
}

}  // namespace

void kv_store(TensorType t, const float* src, int64_t n_rows, int64_t row_len, const int32_t* slots, uint8_t* cache) {
  check_kv_type(t);
  const int64_t row_bytes = static_cast<int64_t>(gguf::type_bytes(t, static_cast<uint64_t>(row_len)));
  for (int64_t r = 0; r < n_rows; ++r) quantize_row(t, src + r * row_len, cache + slots[r] * row_bytes, row_len);
}

void attention(const float* q, const int32_t* q_pos, int64_t n_q, TensorType kv_type, const uint8_t* k_cache,
               const uint8_t* v_cache, const int32_t* slots, const int32_t* slot_pos, int64_t n_kv,
               const AttentionShape& shape, float* out) {
  check_kv_type(kv_type);
  if (shape.n_head_kv <= 0 || shape.n_head % shape.n_head_kv != 0)
    throw std::invalid_argument("ref::attention: n_head must be a multiple of n_head_kv");
  const int64_t hd = shape.head_dim, row_len = shape.n_head_kv * hd;
  const int64_t row_bytes = static_cast<int64_t>(gguf::type_bytes(kv_type, static_cast<uint64_t>(row_len)));
  const int64_t group = shape.n_head / shape.n_head_kv;
  const float kq_scale = shape.scale > 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(hd));

  // The listed cache rows, dequantized once: [n_kv][n_head_kv * head_dim] f32 each.
  std::vector<float> k(static_cast<size_t>(n_kv * row_len)), v(k.size());
  for (int64_t j = 0; j < n_kv; ++j) {
    dequantize_row(kv_type, k_cache + slots[j] * row_bytes, k.data() + j * row_len, row_len);
    dequantize_row(kv_type, v_cache + slots[j] * row_bytes, v.data() + j * row_len, row_len);
  }

  std::vector<float> scores(static_cast<size_t>(n_kv));  // [n_kv] f32, one query head's logits
  std::vector<int64_t> visible;                           // indices j the query sees
  for (int64_t i = 0; i < n_q; ++i) {
    visible.clear();
    for (int64_t j = 0; j < n_kv; ++j)
      if (slot_pos[j] <= q_pos[i] && (shape.window == 0 || q_pos[i] - slot_pos[j] < shape.window)) visible.push_back(j);
    for (int64_t h = 0; h < shape.n_head; ++h) {
      const float* qh = q + (i * shape.n_head + h) * hd;
      float* oh = out + (i * shape.n_head + h) * hd;
      const int64_t kv_off = (h / group) * hd;
      for (int64_t d = 0; d < hd; ++d) oh[d] = 0.0f;
      if (visible.empty()) continue;
      const int64_t n_vis = static_cast<int64_t>(visible.size());
      for (int64_t s = 0; s < n_vis; ++s) {
        const float* kh = k.data() + visible[static_cast<size_t>(s)] * row_len + kv_off;
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += qh[d] * kh[d];
        float score = dot * kq_scale;
        if (shape.softcap > 0.0f) score = shape.softcap * std::tanh(score / shape.softcap);
        scores[static_cast<size_t>(s)] = score;
      }
      softmax(scores.data(), n_vis, scores.data());
      for (int64_t s = 0; s < n_vis; ++s) {
        const float* vh = v.data() + visible[static_cast<size_t>(s)] * row_len + kv_off;
        for (int64_t d = 0; d < hd; ++d) oh[d] += scores[static_cast<size_t>(s)] * vh[d];
      }
    }
  }
}

}  // namespace vkllm::ref
