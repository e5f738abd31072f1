// make_model: writes a random-weight GGUF model of any llama/qwen2/qwen3/phi3/gemma2/gemma3 shape and weight type.
//
// Usage:
//   make_model -o FILE [--preset 1b] [--arch llama|qwen2|qwen3|phi3|gemma2|gemma3] [--layers N] [--embd N] [--ff N]
//              [--heads N] [--kv-heads N] [--head-dim N] [--vocab N] [--ctx N] [--type TYPE] [--tied]
//              [--rope-base F] [--rms-eps F] [--seed S] [--vocab-from FILE.gguf | --byte-vocab]
//
//   --type      weight type of every matrix (token_embd and output included): f32 f16 bf16 q4_0
//               q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs. Norms and biases stay F32.
//   --preset 1b a Llama-3.2-1B-like shape: 16 layers, embd 2048, ff 8192, 32 heads, 8 KV heads,
//               vocab 32000, ctx 8192, rope base 500000, tied embeddings. Options given
//               explicitly override the preset.
//   --head-dim  per-head width (attention.key_length); default embd / heads
//   --rot N     rope.dimension_count (partial rotary; default the head dim)
//   phi3: fused attn_qkv and gate|up ffn_up; LongRoPE divisors rope_factors_long / _short (1 up to
//               4 and 1 up to 1.5 across the pairs); --orig-ctx N writes rope.scaling.original_context_length (the
//               long factors apply past it) and --attn-factor F rope.scaling.attn_factor
//   gemma2/gemma3: tied embeddings (llama.cpp reads no output.weight for them), post-attention and
//               post-FFN norms, attention.key_length written; --window N attention.sliding_window;
//               gemma2 --attn-softcap F / --final-softcap F write the soft-capping keys (llama.cpp's
//               defaults 50 and 30 otherwise); gemma3 q/k norms, --rope-scale F writes linear
//               rope.scaling.factor (its global layers' scaling); --post-norm F centres the
//               post-norm weights at F, so the layers outweigh the √n_embd-scaled input embedding
//               (which, tied to the output, otherwise makes the last token the likeliest next one)
//   --rope-scale F --rope-scaling TYPE  rope.scaling.factor and .type (default linear) for any
//               architecture; with yarn, --orig-ctx N sets the original context its ramp is cut from
//   --key-f32 KEY=VALUE  any further <arch>.KEY as an f32 (repeatable)
//   --logit-scale S  output.weight drawn S times wider (when tied, the output norm's weights are S
//               instead of 1), so the logits have standard deviation ≈ S and the greedy choices
//               clear margins (references need decided steps)
//   --vocab-from copies every tokenizer.* key from that GGUF (default: ../shared's
//               models/stories260K.gguf when it exists); --byte-vocab generates a SentencePiece
//               byte-fallback vocabulary instead (<unk> <s> </s> <0x00>…<0xFF>). A --vocab larger
//               than the tokenizer is padded with unused tokens "<unused_N>".
//
// Examples:
//   make_model --type q4_0 -o /tmp/tiny.gguf
//   make_model --preset 1b --type q4_0 -o /tmp/llama-1b-q4_0.gguf     (~0.6 GiB)
//   make_model --arch qwen2 --layers 2 --embd 128 --ff 512 --heads 2 --kv-heads 1 --tied -o q.gguf
//
// Weights are N(0, 1/sqrt(row length)) so every matrix-vector product keeps unit-scale
// activations; norm weights are 1, qwen2's Q/K/V biases N(0, 0.1), qwen3's per-head q/k norm
// weights 1 + N(0, 0.2). Each row's random stream is
// seeded from (seed, tensor name, row), so the output does not depend on the thread count.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gguf.h"
#include "reference/ref_ops.h"
#include "test_support.h"

namespace {

using gguf::TensorType;
using gguf::Value;

struct Options {
  std::string out;
  std::string preset;
  std::string arch = "llama";
  uint32_t n_layer = 2;
  uint32_t n_embd = 256;
  uint32_t n_ff = 768;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t head_dim = 0;  // 0: n_embd / n_head
  float logit_scale = 1.0f;
  uint32_t n_rot = 0;      // 0: the head dim
  uint32_t orig_ctx = 0;   // phi3: rope.scaling.original_context_length (0: not written)
  std::vector<std::string> f32_keys;  // --key-f32 KEY=VALUE: <arch>.KEY written as f32
  float attn_factor = 0.0f;  // phi3: rope.scaling.attn_factor (0: not written)
  uint32_t window = 0;       // gemma2/3: attention.sliding_window (0: not written)
  float attn_softcap = 0.0f;   // gemma2: attn_logit_softcapping (0: not written)
  float final_softcap = 0.0f;  // gemma2: final_logit_softcapping (0: not written)
  float rope_scale = 0.0f;     // linear rope.scaling.factor (0: not written)
  std::string rope_scaling = "linear";  // rope.scaling.type written with --rope-scale
  float post_norm = 1.0f;      // gemma2/3: centre of the post-norm weights
  uint32_t n_vocab = 0;  // 0: the tokenizer's size
  uint32_t n_ctx = 4096;
  std::string type = "f32";
  bool tied = false;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  uint64_t seed = 42;
  std::string vocab_from;
  bool byte_vocab = false;
};

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash_name(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The standard normal's quantiles at k / 65536 (k = 0..65536; the two infinite ends replaced by
// the quantiles at 0.5 / 65536 and 1 - 0.5 / 65536), found by bisection on erfc.
const std::vector<float>& normal_quantiles() {
  static const std::vector<float> table = [] {
    constexpr int kN = 1 << 16;
    std::vector<float> t(kN + 1);
    for (int k = 0; k <= kN; ++k) {
      const double p = std::clamp(static_cast<double>(k), 0.5, kN - 0.5) / kN;
      double lo = -10.0, hi = 10.0;
      for (int it = 0; it < 60; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::numbers::sqrt2) < p ? lo : hi) = mid;
      }
      t[static_cast<size_t>(k)] = static_cast<float>(0.5 * (lo + hi));
    }
    return t;
  }();
  return table;
}

// Fills x with N(0, sigma) samples from a stream seeded by `seed`: each 32 random bits pick a
// quantile interval (16 bits) and a point inside it (16 bits, linear interpolation). Much faster
// than Box-Muller, which matters for billion-parameter models.
void fill_gaussian(uint64_t seed, float sigma, float* x, int64_t n) {
  const std::vector<float>& t = normal_quantiles();
  uint64_t state = seed;
  auto sample = [&](uint32_t u) {
    const size_t k = u >> 16;
    const float frac = static_cast<float>(u & 0xffff) * 0x1.0p-16f;
    return sigma * (t[k] + frac * (t[k + 1] - t[k]));
  };
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t bits = splitmix64(state);
    x[i] = sample(static_cast<uint32_t>(bits));
    if (i + 1 < n) x[i + 1] = sample(static_cast<uint32_t>(bits >> 32));
  }
}

class ModelWriter {
 public:
  ModelWriter(const Options& o, TensorType type) : o_(o), type_(type) {}

  // A matrix [n_rows][n_cols] (GGUF ne = {n_cols, n_rows}) of N(0, 1/sqrt(n_cols)) in the weight type.
  void matrix(const std::string& name, uint64_t n_cols, uint64_t n_rows, float scale = 1.0f) {
    random_tensor(name, type_, n_cols, n_rows, scale / std::sqrt(static_cast<float>(n_cols)));
  }
  void bias(const std::string& name, uint64_t n) { random_tensor(name, TensorType::F32, n, 1, 0.1f); }
  // RoPE frequency divisors from 1 up to 1 + spread across the pairs, growing as LongRoPE's do.
  void divisors(const std::string& name, uint64_t n, float spread) {
    std::vector<float> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = 1.0f + spread * static_cast<float>(i) / static_cast<float>(n);
    f32_vector(name, v);
  }
  // Norm weights near `centre`: centre · (1 + N(0, 0.2)).
  void scales(const std::string& name, uint64_t n, float centre = 1.0f) {
    std::vector<float> v(n);
    uint64_t state = o_.seed ^ hash_name(name);
    fill_gaussian(splitmix64(state), 0.2f, v.data(), static_cast<int64_t>(n));
    for (float& x : v) x = centre * (x + 1.0f);
    f32_vector(name, v);
  }
  void ones(const std::string& name, uint64_t n, float value = 1.0f) { f32_vector(name, std::vector<float>(n, value)); }
  gguf::Writer& writer() { return w_; }
  uint64_t n_params() const { return n_params_; }

 private:
  void f32_vector(const std::string& name, const std::vector<float>& v) {
    w_.add_tensor(name, TensorType::F32, {v.size()}, {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
    n_params_ += v.size();
  }

  void random_tensor(const std::string& name, TensorType t, uint64_t n_cols, uint64_t n_rows, float sigma) {
    const uint64_t row_bytes = gguf::type_bytes(t, n_cols);
    std::vector<uint8_t> data(row_bytes * n_rows);
    const uint64_t name_seed = o_.seed ^ hash_name(name);
    normal_quantiles();  // built once, before the threads share it
    const uint64_t n_threads = std::clamp<uint64_t>(std::thread::hardware_concurrency(), 1, n_rows);
    auto work = [&](uint64_t first, uint64_t last) {
      std::vector<float> row(n_cols);  // [n_cols] f32
      for (uint64_t r = first; r < last; ++r) {
        uint64_t s = name_seed + r;
        fill_gaussian(splitmix64(s), sigma, row.data(), static_cast<int64_t>(n_cols));
        vkllm::ref::quantize_row(t, row.data(), data.data() + r * row_bytes, static_cast<int64_t>(n_cols));
      }
    };
    std::vector<std::thread> threads;
    for (uint64_t i = 0; i < n_threads; ++i) threads.emplace_back(work, n_rows * i / n_threads, n_rows * (i + 1) / n_threads);
    for (std::thread& th : threads) th.join();
    w_.add_tensor(name, t, n_rows == 1 ? std::vector<uint64_t>{n_cols} : std::vector<uint64_t>{n_cols, n_rows}, data);
    n_params_ += n_cols * n_rows;
  }

  const Options& o_;
  TensorType type_;
  gguf::Writer w_;
  uint64_t n_params_ = 0;
};

// llama.cpp's general.file_type (llama_ftype) for a file whose matrices are all `t`.
uint32_t file_type(TensorType t) {
  switch (t) {
    case TensorType::F32: return 0;
    case TensorType::F16: return 1;
    case TensorType::Q4_0: return 2;
    case TensorType::Q4_1: return 3;
    case TensorType::Q8_0: return 7;
    case TensorType::Q5_0: return 8;
    case TensorType::Q5_1: return 9;
    case TensorType::Q2_K: return 10;
    case TensorType::Q3_K: return 11;  // Q3_K_S
    case TensorType::Q4_K: return 14;  // Q4_K_S
    case TensorType::Q5_K: return 16;  // Q5_K_S
    case TensorType::Q6_K: return 18;
    case TensorType::IQ4_NL: return 25;
    case TensorType::IQ4_XS: return 30;
    default: return 32;               // BF16
  }
}

// Copies tokenizer.* from `path`, padding the vocabulary to n_vocab (0: keep). Returns the size.
uint32_t copy_tokenizer(const std::string& path, uint32_t n_vocab, gguf::Writer& w) {
  const gguf::File src = gguf::File::open(path);
  const uint64_t n_src = src.get_array("tokenizer.ggml.tokens").count;
  if (n_vocab == 0) n_vocab = static_cast<uint32_t>(n_src);
  if (n_vocab < n_src)
    throw gguf::Error("--vocab " + std::to_string(n_vocab) + " is smaller than " + path + "'s " + std::to_string(n_src) + " tokens");
  for (const auto& [key, value] : src.metadata()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    if (n_vocab == n_src || value.type != gguf::ValueType::ARRAY || std::get<gguf::Array>(value.data).count != n_src) {
      w.set(key, value);
      continue;
    }
    const gguf::Array& a = std::get<gguf::Array>(value.data);  // a per-token array: pad it
    if (key == "tokenizer.ggml.tokens") {
      std::vector<std::string> tokens = a.strings;
      for (uint64_t i = n_src; i < n_vocab; ++i) tokens.push_back("<unused_" + std::to_string(i) + ">");
      w.set(key, Value::strings(std::move(tokens)));
    } else if (key == "tokenizer.ggml.scores") {
      std::vector<float> scores;
      for (uint64_t i = 0; i < n_src; ++i) scores.push_back(static_cast<float>(a.float_at(i)));
      scores.resize(n_vocab, -1e9f);
      w.set(key, Value::f32s(scores));
    } else if (key == "tokenizer.ggml.token_type") {
      std::vector<int32_t> types;
      for (uint64_t i = 0; i < n_src; ++i) types.push_back(static_cast<int32_t>(a.int_at(i)));
      types.resize(n_vocab, 5);  // LLAMA_TOKEN_TYPE_UNUSED
      w.set(key, Value::i32s(types));
    } else {
      throw gguf::Error(path + ": cannot pad per-token array '" + key + "' to " + std::to_string(n_vocab) + " tokens");
    }
  }
  return n_vocab;
}

// A SentencePiece vocabulary of byte-fallback tokens only, padded to n_vocab (0: 259).
uint32_t byte_tokenizer(uint32_t n_vocab, gguf::Writer& w) {
  if (n_vocab == 0) n_vocab = 259;
  if (n_vocab < 259) throw gguf::Error("--vocab " + std::to_string(n_vocab) + ": a byte vocabulary needs at least 259 tokens");
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};  // unknown, control, control
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.emplace_back(name);
    types.push_back(6);  // byte
  }
  for (uint32_t i = 259; i < n_vocab; ++i) {
    tokens.push_back("<unused_" + std::to_string(i) + ">");
    types.push_back(5);
  }
  const std::vector<float> scores(n_vocab, 0.0f);
  w.set("tokenizer.ggml.model", Value::str("llama"));
  w.set("tokenizer.ggml.tokens", Value::strings(std::move(tokens)));
  w.set("tokenizer.ggml.scores", Value::f32s(scores));
  w.set("tokenizer.ggml.token_type", Value::i32s(types));
  w.set("tokenizer.ggml.unknown_token_id", Value::u32(0));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(2));
  return n_vocab;
}

bool is_gemma(const Options& o) { return o.arch == "gemma2" || o.arch == "gemma3"; }

void check_shape(const Options& o, TensorType type) {
  auto fail = [](const std::string& m) { throw gguf::Error(m); };
  if (o.arch != "llama" && o.arch != "qwen2" && o.arch != "qwen3" && o.arch != "phi3" && !is_gemma(o))
    fail("--arch " + o.arch + ": expected llama, qwen2, qwen3, phi3, gemma2 or gemma3");
  if (o.arch == "gemma3" && o.window == 0) fail("--arch gemma3 needs --window (llama.cpp requires attention.sliding_window)");
  if (o.n_layer == 0 || o.n_embd == 0 || o.n_ff == 0 || o.n_head == 0 || o.n_head_kv == 0 || o.n_ctx == 0)
    fail("--layers, --embd, --ff, --heads, --kv-heads and --ctx must be > 0");
  if (o.head_dim == 0 && o.n_embd % o.n_head != 0)
    fail("--embd " + std::to_string(o.n_embd) + " is not a multiple of --heads " + std::to_string(o.n_head));
  if (o.n_head % o.n_head_kv != 0) fail("--heads " + std::to_string(o.n_head) + " is not a multiple of --kv-heads " + std::to_string(o.n_head_kv));
  const uint32_t head_dim = o.head_dim ? o.head_dim : o.n_embd / o.n_head;
  if (head_dim % 2 != 0) fail("head dim " + std::to_string(head_dim) + " must be even for RoPE");
  if (o.n_rot % 2 != 0 || o.n_rot > head_dim) fail("--rot " + std::to_string(o.n_rot) + " must be even and ≤ the head dim");
  if (o.n_head * head_dim % gguf::type_info(static_cast<uint32_t>(type))->block_size != 0)
    fail("heads × head dim " + std::to_string(o.n_head * head_dim) + " is not a multiple of the " + gguf::type_name(type) + " block size");
  const uint32_t block = gguf::type_info(static_cast<uint32_t>(type))->block_size;
  // Every matrix's row length is n_embd or n_ff (ffn_down).
  for (const auto& [what, n] : {std::pair{"--embd", o.n_embd}, std::pair{"--ff", o.n_ff}})
    if (n % block != 0)
      fail(std::string(what) + " " + std::to_string(n) + " is not a multiple of the " + gguf::type_name(type) +
           " block size " + std::to_string(block));
}

void apply_preset(Options& o, const CLI::App& app) {
  if (o.preset.empty()) return;
  if (o.preset != "1b") throw gguf::Error("--preset " + o.preset + ": the only preset is 1b");
  auto unset = [&](const char* flag) { return app.get_option(flag)->count() == 0; };
  if (unset("--layers")) o.n_layer = 16;
  if (unset("--embd")) o.n_embd = 2048;
  if (unset("--ff")) o.n_ff = 8192;
  if (unset("--heads")) o.n_head = 32;
  if (unset("--kv-heads")) o.n_head_kv = 8;
  if (unset("--vocab")) o.n_vocab = 32000;
  if (unset("--ctx")) o.n_ctx = 8192;
  if (unset("--rope-base")) o.rope_base = 500000.0f;
  if (unset("--tied")) o.tied = true;
}

void make_model(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  const std::optional<TensorType> type = gguf::type_from_name(o.type);
  if (!type || !vkllm::ref::is_supported(*type)) throw gguf::Error("--type " + o.type + ": not a supported weight type");
  check_shape(o, *type);
  if (o.byte_vocab && !o.vocab_from.empty()) throw gguf::Error("--byte-vocab and --vocab-from exclude each other");
  ModelWriter m(o, *type);
  const bool tied = o.tied || is_gemma(o);
  gguf::Writer& w = m.writer();
  const std::string a = o.arch + ".";
  const uint32_t head_dim = o.head_dim ? o.head_dim : o.n_embd / o.n_head, qd = o.n_head * head_dim;
  w.set("general.architecture", Value::str(o.arch));
  w.set("general.name", Value::str("make_model " + o.arch + " " + std::to_string(o.n_layer) + "x" + std::to_string(o.n_embd) +
                                   " " + gguf::type_name(*type)));
  w.set("general.file_type", Value::u32(file_type(*type)));
  if (gguf::type_info(static_cast<uint32_t>(*type))->block_size > 1) w.set("general.quantization_version", Value::u32(2));
  w.set(a + "context_length", Value::u32(o.n_ctx));
  w.set(a + "embedding_length", Value::u32(o.n_embd));
  w.set(a + "feed_forward_length", Value::u32(o.n_ff));
  w.set(a + "block_count", Value::u32(o.n_layer));
  w.set(a + "attention.head_count", Value::u32(o.n_head));
  w.set(a + "attention.head_count_kv", Value::u32(o.n_head_kv));
  w.set(a + "rope.freq_base", Value::f32(o.rope_base));
  const uint32_t n_rot = o.n_rot ? o.n_rot : head_dim;
  w.set(a + "rope.dimension_count", Value::u32(n_rot));
  if (o.orig_ctx) w.set(a + "rope.scaling.original_context_length", Value::u32(o.orig_ctx));
  if (o.attn_factor > 0.0f) w.set(a + "rope.scaling.attn_factor", Value::f32(o.attn_factor));
  for (const std::string& kv : o.f32_keys) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) throw std::runtime_error("--key-f32 " + kv + ": expected KEY=VALUE");
    w.set(a + kv.substr(0, eq), Value::f32(std::stof(kv.substr(eq + 1))));
  }
  if (o.rope_scale > 0.0f) {
    w.set(a + "rope.scaling.type", Value::str(o.rope_scaling));
    w.set(a + "rope.scaling.factor", Value::f32(o.rope_scale));
  }
  if (o.window) w.set(a + "attention.sliding_window", Value::u32(o.window));
  if (o.attn_softcap > 0.0f) w.set(a + "attn_logit_softcapping", Value::f32(o.attn_softcap));
  if (o.final_softcap > 0.0f) w.set(a + "final_logit_softcapping", Value::f32(o.final_softcap));
  if (o.head_dim || o.arch == "qwen3" || is_gemma(o)) {
    w.set(a + "attention.key_length", Value::u32(head_dim));
    w.set(a + "attention.value_length", Value::u32(head_dim));
  }
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(o.rms_eps));

  std::string vocab_from = o.vocab_from;
  if (vocab_from.empty() && !o.byte_vocab && vkllm::test::shared_exists("models/stories260K.gguf"))
    vocab_from = vkllm::test::shared_path("models/stories260K.gguf");
  const uint32_t n_vocab = vocab_from.empty() ? byte_tokenizer(o.n_vocab, w) : copy_tokenizer(vocab_from, o.n_vocab, w);
  w.set(a + "vocab_size", Value::u32(n_vocab));

  // Tensors in llama.cpp's order; shapes as [row length, rows].
  const uint32_t n_embd_kv = o.n_head_kv * head_dim;
  m.matrix("token_embd.weight", o.n_embd, n_vocab);
  if (o.arch == "phi3") {
    m.divisors("rope_factors_long.weight", n_rot / 2, 3.0f);
    m.divisors("rope_factors_short.weight", n_rot / 2, 0.5f);
  }
  for (uint32_t l = 0; l < o.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    m.ones(p + "attn_norm.weight", o.n_embd);
    if (o.arch == "phi3") {
      m.matrix(p + "attn_qkv.weight", o.n_embd, qd + 2 * n_embd_kv);
    } else {
      m.matrix(p + "attn_q.weight", o.n_embd, qd);
      m.matrix(p + "attn_k.weight", o.n_embd, n_embd_kv);
      m.matrix(p + "attn_v.weight", o.n_embd, n_embd_kv);
    }
    if (o.arch == "qwen2") {
      m.bias(p + "attn_q.bias", qd);
      m.bias(p + "attn_k.bias", n_embd_kv);
      m.bias(p + "attn_v.bias", n_embd_kv);
    }
    if (o.arch == "qwen3" || o.arch == "gemma3") {
      m.scales(p + "attn_q_norm.weight", head_dim);
      m.scales(p + "attn_k_norm.weight", head_dim);
    }
    m.matrix(p + "attn_output.weight", qd, o.n_embd);
    if (is_gemma(o)) m.scales(p + "post_attention_norm.weight", o.n_embd, o.post_norm);
    m.ones(p + "ffn_norm.weight", o.n_embd);
    if (o.arch == "phi3") {
      m.matrix(p + "ffn_up.weight", o.n_embd, 2 * uint64_t{o.n_ff});  // gate rows, then up rows
    } else {
      m.matrix(p + "ffn_gate.weight", o.n_embd, o.n_ff);
      m.matrix(p + "ffn_up.weight", o.n_embd, o.n_ff);
    }
    m.matrix(p + "ffn_down.weight", o.n_ff, o.n_embd);
    if (is_gemma(o)) m.scales(p + "post_ffw_norm.weight", o.n_embd, o.post_norm);
  }
  m.ones("output_norm.weight", o.n_embd, tied ? o.logit_scale : 1.0f);
  if (!tied) m.matrix("output.weight", o.n_embd, n_vocab, o.logit_scale);

  w.write(o.out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %s, %u layers, embd %u, ff %u, heads %u/%u, vocab %u%s, %.3fB params, %s, %.1f s\n", o.out.c_str(),
              o.arch.c_str(), o.n_layer, o.n_embd, o.n_ff, o.n_head, o.n_head_kv, n_vocab, tied ? " (tied)" : "",
              static_cast<double>(m.n_params()) * 1e-9, gguf::type_name(*type).c_str(), secs);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"make_model: write a random-weight llama/qwen2/qwen3/phi3/gemma2/gemma3 GGUF model"};
  Options o;
  app.add_option("-o,--output", o.out, "output GGUF file")->required();
  app.add_option("--preset", o.preset, "shape preset: 1b (Llama-3.2-1B-like)");
  app.add_option("--arch", o.arch, "llama, qwen2, qwen3, phi3, gemma2 or gemma3");
  app.add_option("--layers", o.n_layer, "transformer blocks");
  app.add_option("--embd", o.n_embd, "residual width");
  app.add_option("--ff", o.n_ff, "feed-forward width");
  app.add_option("--heads", o.n_head, "query heads");
  app.add_option("--kv-heads", o.n_head_kv, "key/value heads");
  app.add_option("--head-dim", o.head_dim, "per-head width (default: embd / heads)");
  app.add_option("--rot", o.n_rot, "rope.dimension_count (default: the head dim)");
  app.add_option("--orig-ctx", o.orig_ctx, "phi3: rope.scaling.original_context_length");
  app.add_option("--key-f32", o.f32_keys, "KEY=VALUE: writes <arch>.KEY as an f32 (repeatable), e.g. rope.scaling.yarn_beta_fast=8");
  app.add_option("--attn-factor", o.attn_factor, "phi3: rope.scaling.attn_factor");
  app.add_option("--window", o.window, "gemma2/gemma3: attention.sliding_window");
  app.add_option("--attn-softcap", o.attn_softcap, "gemma2: attn_logit_softcapping");
  app.add_option("--final-softcap", o.final_softcap, "gemma2: final_logit_softcapping");
  app.add_option("--rope-scale", o.rope_scale, "linear rope.scaling.factor");
  app.add_option("--rope-scaling", o.rope_scaling, "rope.scaling.type written with --rope-scale (default linear; yarn, or an unknown type to test its refusal)");
  app.add_option("--post-norm", o.post_norm, "gemma2/gemma3: post-norm weights near this (default 1)");
  app.add_option("--logit-scale", o.logit_scale, "output.weight drawn this many times wider (peaked logits)");
  app.add_option("--vocab", o.n_vocab, "vocabulary size (default: the tokenizer's)");
  app.add_option("--ctx", o.n_ctx, "context_length metadata");
  app.add_option("--type", o.type, "weight type of the matrices (f32, f16, bf16, q4_0 … q6_k)");
  app.add_flag("--tied", o.tied, "no output.weight: logits use token_embd");
  app.add_option("--rope-base", o.rope_base, "rope.freq_base");
  app.add_option("--rms-eps", o.rms_eps, "attention.layer_norm_rms_epsilon");
  app.add_option("--seed", o.seed, "random seed");
  app.add_option("--vocab-from", o.vocab_from, "copy tokenizer.* keys from this GGUF");
  app.add_flag("--byte-vocab", o.byte_vocab, "generate a byte-fallback vocabulary");
  try {
    app.parse(argc, argv);
    apply_preset(o, app);
    make_model(o);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_model: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
