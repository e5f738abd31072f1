// Reference float ops: matrix-vector products, embedding lookup, norms, element-wise ops, softmax, argmax, RoPE.
#include "ref_ops.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace vkllm::ref {

using gguf::TensorType;

void matvec(TensorType t, const uint8_t* w, int64_t n_rows, int64_t n_cols, const float* x, float* y) {
  const int64_t row_bytes = static_cast<int64_t>(gguf::type_bytes(t, static_cast<uint64_t>(n_cols)));
  std::vector<float> row(static_cast<size_t>(n_cols));  // [n_cols] f32, one dequantized row of W
  for (int64_t r = 0; r < n_rows; ++r) {
    dequantize_row(t, w + r * row_bytes, row.data(), n_cols);
    float sum = 0.0f;
    for (int64_t c = 0; c < n_cols; ++c) sum += row[static_cast<size_t>(c)] * x[c];
    y[r] = sum;
  }
}

// Same sums as matvec per token; each row of W is dequantized once for all tokens.
void matmul(TensorType t, const uint8_t* w, int64_t n_rows, int64_t n_cols, const float* x, int64_t n_tokens,
            float* y) {
  const int64_t row_bytes = static_cast<int64_t>(gguf::type_bytes(t, static_cast<uint64_t>(n_cols)));
  std::vector<float> row(static_cast<size_t>(n_cols));  // [n_cols] f32
  for (int64_t r = 0; r < n_rows; ++r) {
    dequantize_row(t, w + r * row_bytes, row.data(), n_cols);
    for (int64_t i = 0; i < n_tokens; ++i) {
      const float* xi = x + i * n_cols;
      float sum = 0.0f;
      for (int64_t c = 0; c < n_cols; ++c) sum += row[static_cast<size_t>(c)] * xi[c];
      y[i * n_rows + r] = sum;
    }
  }
}

void matmul_q4_0_x9(const uint8_t* w, int64_t n_rows, int64_t n_cols, const float* x, int64_t n_tokens, float* y) {
  const int64_t blocks = n_cols / 32, row_bytes = blocks * 18;
  for (int64_t i = 0; i < n_tokens; ++i) {
    // x quantized block by block: [n_cols] values and [blocks] scales.
    std::vector<int32_t> xq(static_cast<size_t>(n_cols));
    std::vector<float> xd(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + i * n_cols + 32 * b;
      float amax = 0.0f;
      for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(xb[k]));
      const float id = amax != 0.0f ? 255.0f / amax : 0.0f;
      xd[size_t(b)] = amax / 255.0f;
      for (int k = 0; k < 32; ++k) xq[size_t(32 * b + k)] = static_cast<int32_t>(std::nearbyint(xb[k] * id));
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = w + r * row_bytes + 18 * b;
        const float d = fp16_to_f32(static_cast<uint16_t>(blk[0] | blk[1] << 8));
        int32_t s = 0;
        for (int j = 0; j < 16; ++j) {
          s += ((blk[2 + j] & 0xF) - 8) * xq[size_t(32 * b + j)];
          s += ((blk[2 + j] >> 4) - 8) * xq[size_t(32 * b + 16 + j)];
        }
        sum += double(d * xd[size_t(b)] * float(s));
      }
      y[i * n_rows + r] = static_cast<float>(sum);
    }
  }
}

void get_rows(TensorType t, const uint8_t* table, int64_t n_cols, const int32_t* ids, int64_t n_ids, float* out) {
  const int64_t row_bytes = static_cast<int64_t>(gguf::type_bytes(t, static_cast<uint64_t>(n_cols)));
  for (int64_t i = 0; i < n_ids; ++i) dequantize_row(t, table + ids[i] * row_bytes, out + i * n_cols, n_cols);
}

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* out) {
  for (int64_t r = 0; r < n_rows; ++r, x += n, out += n) {
    float sum_sq = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv_rms * (w ? w[i] : 1.0f);
  }
}

void add(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void mul(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

void scale(const float* x, float s, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = s * x[i];
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void geglu(const float* gate, const float* up, int64_t n, float* out) {
  constexpr double k = 0.7978845608028654;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

void softcap(const float* x, float cap, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = cap * std::tanh(x[i] / cap);
}

void softmax(const float* x, int64_t n, float* out) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::fmax(mx, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(x[i] - mx);
    sum += out[i];
  }
  for (int64_t i = 0; i < n; ++i) out[i] /= sum;
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

// Pair k (0 ≤ k < n_rot/2) of a token at position `pos` turns by
//   freq_scale * pos * freq_base^(-2k / n_rot) / freq_factors[k]
// (ggml_rope_ext with ext_factor 0: theta_interp, mscale 1). Normal style rotates elements
// (2k, 2k+1), NeoX (k, k + n_rot/2); elements from n_rot on are copied.
void rope(const float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, const RopeParams& p, float* out) {
  if (p.n_rot % 2 != 0 || p.n_rot > p.head_dim) throw std::invalid_argument("ref::rope: n_rot must be even and ≤ head_dim");
  const int64_t half = p.n_rot / 2;
  // YaRN: each pair's share of the unscaled angle. Pair k turns
  // n_ctx_orig / (2π base^(2k/n_rot)) times over the original context; it counts as turning β times
  // at k(β) = n_rot · ln(n_ctx_orig / (2πβ)) / (2 ln base).
  std::vector<double> extrap_share(static_cast<size_t>(half), 0.0);
  const double mscale = p.attn_factor;
  if (p.ext_factor > 0.0f) {
    const auto pair_turning = [&](double beta) {
      return static_cast<double>(p.n_rot) * std::log(static_cast<double>(p.n_ctx_orig) / (2.0 * M_PI * beta)) /
             (2.0 * std::log(static_cast<double>(p.freq_base)));
    };
    const double lo = std::max(0.0, std::floor(pair_turning(p.beta_fast)));
    const double hi = std::min(static_cast<double>(p.n_rot - 1), std::ceil(pair_turning(p.beta_slow)));
    for (int64_t k = 0; k < half; ++k) {
      const double y = (static_cast<double>(k) - lo) / std::max(0.001, hi - lo);
      extrap_share[static_cast<size_t>(k)] = p.ext_factor * (1.0 - std::clamp(y, 0.0, 1.0));
    }
  }
  std::vector<float> cos_k(static_cast<size_t>(half)), sin_k(static_cast<size_t>(half));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t k = 0; k < half; ++k) {
      const double inv_freq = std::pow(static_cast<double>(p.freq_base), -2.0 * static_cast<double>(k) / static_cast<double>(p.n_rot));
      const double ff = p.freq_factors ? p.freq_factors[k] : 1.0;
      const double share = extrap_share[static_cast<size_t>(k)];
      const double theta = (static_cast<double>(p.freq_scale) * (1.0 - share) + share) * pos[t] * inv_freq / ff;
      cos_k[static_cast<size_t>(k)] = static_cast<float>(std::cos(theta) * mscale);
      sin_k[static_cast<size_t>(k)] = static_cast<float>(std::sin(theta) * mscale);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* src = x + (t * n_heads + h) * p.head_dim;
      float* dst = out + (t * n_heads + h) * p.head_dim;
      for (int64_t k = 0; k < half; ++k) {
        const int64_t i0 = p.style == RopeStyle::Normal ? 2 * k : k;
        const int64_t i1 = p.style == RopeStyle::Normal ? 2 * k + 1 : k + half;
        const float c = cos_k[static_cast<size_t>(k)], s = sin_k[static_cast<size_t>(k)];
        const float x0 = src[i0], x1 = src[i1];
        dst[i0] = x0 * c - x1 * s;
        dst[i1] = x0 * s + x1 * c;
      }
      for (int64_t i = p.n_rot; i < p.head_dim; ++i) dst[i] = src[i];
    }
  }
}

}  // namespace vkllm::ref
