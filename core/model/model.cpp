// The tensor table of llama/qwen2/qwen3/phi3/gemma2/gemma3 GGUF files, its validation, and the weight upload.
#include "model/model.h"

#include <algorithm>
#include <unordered_set>

#include "kernels/ops.h"

namespace vkllm {
namespace {

// One row of the binding table: a GGUF tensor name, its expected ne, and where it goes.
struct Binding {
  std::string name;
  std::vector<uint64_t> ne;  // expected dimensions (GGUF order)
  DeviceTensor* dst;
  bool f32_only;             // norms, biases and rope factors are read as f32 vectors
  // A fused tensor: consecutive row ranges of it go to these tensors instead of dst.
  std::vector<std::pair<DeviceTensor*, uint64_t>> split = {};
  // Consecutive rows with the same `fuse` are uploaded as one tensor there (one dispatch reads
  // them all), when WeightArena::upload_fused allows it.
  DeviceTensor* fuse = nullptr;
};

std::string shape_str(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

void check_tensor(const gguf::File& f, const gguf::TensorInfo& t, const Binding& b) {
  std::vector<uint64_t> actual(t.ne, t.ne + t.n_dims);
  // Trailing 1s are the same shape ([64] == [64, 1]).
  while (actual.size() > b.ne.size() && actual.back() == 1) actual.pop_back();
  if (actual != b.ne)
    throw Error(f.path() + ": tensor '" + t.name + "' has shape " + shape_str(actual) + ", expected " + shape_str(b.ne));
  if (b.f32_only && t.type != gguf::TensorType::F32)
    throw Error(f.path() + ": tensor '" + t.name + "' has type " + gguf::type_name(t.type) + ", expected F32");
  if (!weight_type_supported(t.type))
    throw Error(f.path() + ": tensor '" + t.name + "' has type " + gguf::type_name(t.type) + ", which vkllm cannot run yet");
}

// The name of a fuse group's tensor: "blk.N.attn_qkv" or "blk.N.ffn_gate_up" after its first member.
std::string fused_name(const std::string& first) {
  const size_t layer_end = first.find('.', first.find('.') + 1) + 1;
  return first.substr(0, layer_end) + (first.compare(layer_end, 5, "attn_") == 0 ? "attn_qkv" : "ffn_gate_up");
}

}  // namespace

Model::Model(const VulkanContext& ctx, const gguf::File& file, const ProgressFn& progress, Pipelines* prepare, MatmulUse use,
             const RopeOverrides& rope)
    : file_(file), config_(read_model_config(file, rope)), arena_(ctx) {
  const ModelConfig& c = config_;
  if (c.n_vocab == 0) throw Error(file.path() + ": the model has no vocabulary (tokenizer.ggml.tokens)");
  const uint64_t qd = uint64_t{c.n_head} * c.head_dim, kvd = c.n_embd_kv();

  std::vector<Binding> table;
  table.push_back({"token_embd.weight", {c.n_embd, c.n_vocab}, &weights_.tok_embd, false});
  table.push_back({"output_norm.weight", {c.n_embd}, &weights_.output_norm, false});
  weights_.tied_output = file.find_tensor("output.weight") == nullptr;
  if (!weights_.tied_output) table.push_back({"output.weight", {c.n_embd, c.n_vocab}, &weights_.output, false});
  if (file.find_tensor("rope_freqs.weight")) {
    weights_.rope_freqs.emplace();
    table.push_back({"rope_freqs.weight", {c.n_rot / 2}, &*weights_.rope_freqs, true});
  }
  if (c.arch == Arch::Phi3 && file.find_tensor("rope_factors_long.weight")) {
    weights_.rope_long.emplace();
    weights_.rope_short.emplace();
    table.push_back({"rope_factors_long.weight", {c.n_rot / 2}, &*weights_.rope_long, true});
    table.push_back({"rope_factors_short.weight", {c.n_rot / 2}, &*weights_.rope_short, true});
  }
  weights_.layers.resize(c.n_layer);
  for (uint32_t i = 0; i < c.n_layer; ++i) {
    LayerWeights& l = weights_.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    table.push_back({p + "attn_norm.weight", {c.n_embd}, &l.attn_norm, true});
    if (file.find_tensor(p + "attn_qkv.weight")) {  // phi3: q, k and v rows in one tensor
      table.push_back({p + "attn_qkv.weight", {c.n_embd, qd + 2 * kvd}, nullptr, false, {{&l.wq, qd}, {&l.wk, kvd}, {&l.wv, kvd}}, &l.wqkv});
    } else {
      table.push_back({p + "attn_q.weight", {c.n_embd, qd}, &l.wq, false, {}, &l.wqkv});
      table.push_back({p + "attn_k.weight", {c.n_embd, kvd}, &l.wk, false, {}, &l.wqkv});
      table.push_back({p + "attn_v.weight", {c.n_embd, kvd}, &l.wv, false, {}, &l.wqkv});
    }
    table.push_back({p + "attn_output.weight", {qd, c.n_embd}, &l.wo, false});
    if (c.qkv_bias) {
      table.push_back({p + "attn_q.bias", {qd}, &l.bq, true});
      table.push_back({p + "attn_k.bias", {kvd}, &l.bk, true});
      table.push_back({p + "attn_v.bias", {kvd}, &l.bv, true});
    }
    if (c.qk_norm) {
      table.push_back({p + "attn_q_norm.weight", {c.head_dim}, &l.q_norm, true});
      table.push_back({p + "attn_k_norm.weight", {c.head_dim}, &l.k_norm, true});
    }
    table.push_back({p + "ffn_norm.weight", {c.n_embd}, &l.ffn_norm, true});
    if (c.post_norms) {
      table.push_back({p + "post_attention_norm.weight", {c.n_embd}, &l.attn_post_norm, true});
      table.push_back({p + "post_ffw_norm.weight", {c.n_embd}, &l.ffn_post_norm, true});
    }
    if (c.arch == Arch::Phi3 && !file.find_tensor(p + "ffn_gate.weight")) {  // gate rows, then up rows
      table.push_back({p + "ffn_up.weight", {c.n_embd, 2 * uint64_t{c.n_ff}}, nullptr, false, {{&l.w_gate, c.n_ff}, {&l.w_up, c.n_ff}}, &l.w_gate_up});
    } else {
      table.push_back({p + "ffn_gate.weight", {c.n_embd, c.n_ff}, &l.w_gate, false, {}, &l.w_gate_up});
      table.push_back({p + "ffn_up.weight", {c.n_embd, c.n_ff}, &l.w_up, false, {}, &l.w_gate_up});
    }
    table.push_back({p + "ffn_down.weight", {c.n_ff, c.n_embd}, &l.w_down, false});
  }
  table[1].f32_only = true;  // output_norm

  // Validate everything first: a bad file fails before any device memory is spent.
  uint64_t total = 0;
  std::vector<const gguf::TensorInfo*> infos;
  for (const Binding& b : table) {
    const gguf::TensorInfo* t = file.find_tensor(b.name);
    if (!t) throw Error(file.path() + ": tensor '" + b.name + "' is missing (expected shape " + shape_str(b.ne) + ")");
    check_tensor(file, *t, b);
    infos.push_back(t);
    total += t->n_bytes;
  }
  // Every tensor of the file is one of the model's, as llama.cpp requires: a block_count lowered by
  // corruption ran a shorter model with the rest of the file unread.
  if (infos.size() != file.tensors().size()) {
    std::unordered_set<std::string_view> used;
    for (const Binding& b : table) used.insert(b.name);
    const auto unused = std::find_if(file.tensors().begin(), file.tensors().end(), [&](const gguf::TensorInfo& t) { return !used.count(t.name); });
    throw Error(file.path() + ": " + std::to_string(file.tensors().size() - infos.size()) + " of its " +
                std::to_string(file.tensors().size()) + " tensors are not part of a " + c.arch_name + " model of " +
                std::to_string(c.n_layer) + " layers (block_count), the first '" + (unused != file.tensors().end() ? unused->name : "?") + "'");
  }
  // The matrices' kernels are made while the weights upload (the token embedding is read by rows
  // unless it is the output too); the widest first, as they take longest.
  if (prepare) {
    std::vector<std::pair<uint64_t, gguf::TensorType>> shapes;
    for (size_t i = 0; i < table.size(); ++i)
      if (table[i].ne.size() == 2 && (i != 0 || weights_.tied_output)) shapes.emplace_back(infos[i]->ne[0], infos[i]->type);
    std::sort(shapes.begin(), shapes.end(), std::greater<>());
    shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
    std::vector<PipelineSpec> specs;
    for (const auto& [cols, type] : shapes)
      for (PipelineSpec& s : matmul_pipelines(ctx, type, cols, use)) specs.push_back(std::move(s));
    prepare->prepare(specs);
  }
  uint64_t done = 0;
  const auto on_bytes = [&](uint64_t n) {
    done += n;
    if (progress) progress(done, total);
  };
  auto upload_one = [&](size_t i) {
    if (table[i].split.empty()) {
      *table[i].dst = arena_.upload(*infos[i], on_bytes);
      return;
    }
    uint64_t row = 0;
    for (const auto& [dst, rows] : table[i].split) {
      *dst = arena_.upload_rows_of(*infos[i], row, rows, on_bytes);
      row += rows;
    }
  };
  for (size_t i = 0; i < table.size();) {
    size_t end = i + 1;
    if (!table[i].fuse) {
      upload_one(i++);
      continue;
    }
    // A fuse group: its bindings' rows (a split binding's pieces in order) as one tensor.
    std::vector<WeightArena::RowRange> ranges;
    std::vector<DeviceTensor*> dsts;
    for (end = i; end < table.size() && table[end].fuse == table[i].fuse; ++end) {
      if (table[end].split.empty()) {
        ranges.push_back({infos[end], 0, infos[end]->ne[1]});
        dsts.push_back(table[end].dst);
      }
      uint64_t row = 0;
      for (const auto& [dst, rows] : table[end].split) {
        ranges.push_back({infos[end], row, rows});
        dsts.push_back(dst);
        row += rows;
      }
    }
    if (auto fused = arena_.upload_fused(fused_name(table[i].name), ranges, on_bytes)) {
      *table[i].fuse = std::move(fused->whole);
      for (size_t k = 0; k < dsts.size(); ++k) *dsts[k] = std::move(fused->pieces[k]);
    } else {
      for (size_t k = i; k < end; ++k) upload_one(k);
    }
    i = end;
  }
  if (weights_.tied_output) weights_.output = weights_.tok_embd;
}

const DeviceTensor* Model::rope_factors(uint32_t n_ctx) const {
  if (weights_.rope_freqs) return &*weights_.rope_freqs;
  if (weights_.rope_long) return config_.long_rope(n_ctx) ? &*weights_.rope_long : &*weights_.rope_short;
  return nullptr;
}

uint64_t model_weight_bytes(const gguf::File& file) {
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file.tensors()) total += t.n_bytes;
  return total;
}

}  // namespace vkllm
