// `vkllm info`: what a GGUF model is, and what its KV cache costs per token and in total.
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "base/error.h"
#include "format.h"
#include "kernels/ops.h"
#include "model/kv_layout.h"
#include "model/summary.h"

namespace vkllm::cli {
namespace {

struct InfoOptions {
  std::string model;
  bool json = false;
  uint32_t ctx = 0;   // 0: the trained context
  uint32_t seqs = 1;
  std::string cache_type = "f16";
  uint32_t ubatch = 512;  // the prefill chunk, which sizes the window layers' rings: a GPU's default (info opens no device)
  bool ubatch_given = false;
};


uint32_t window_layers(const ModelConfig& c) {
  uint32_t n = 0;
  for (uint32_t l = 0; l < c.n_layer; ++l) n += c.is_swa(l) ? 1 : 0;
  return n;
}

// The KV bytes of `seqs` conversations of per_seq bytes each; refused when past 2^64 (a --ctx and
// --seqs no machine holds).
uint64_t kv_total(uint64_t per_seq, uint32_t seqs, uint32_t ctx) {
  if (per_seq > std::numeric_limits<uint64_t>::max() / seqs)
    throw Error("--ctx " + std::to_string(ctx) + " × --seqs " + std::to_string(seqs) + " needs more than 16 EiB of KV cache");
  return per_seq * seqs;
}

// On CPU drivers an f16 K cache also keeps a copy of K rotated by RoPE for the decode kernel
// (docs/kv-cache.md, "The rotated copy of K"): one more f16 K row per slot of each global layer,
// per sequence. 0 where that kernel does not take the shape (decode_shape_fits) or its rope table is
// more than one dispatch on lavapipe's grid (rotated_copy_table_fits: the engine's rule); `run`
// prints what the device keeps.
uint64_t rotated_k_copy_bytes(const ModelConfig& c, uint32_t ctx) {
  if (c.n_head_kv == 0 || !decode_shape_fits(AttentionShape{c.n_head, c.n_head_kv, c.head_dim}, ctx) ||
      !rotated_copy_table_fits(ctx, k_min_grid_height))
    return 0;
  return uint64_t{2} * c.n_head_kv * c.head_dim * (c.n_layer - window_layers(c)) * ctx;
}

nlohmann::json to_json(const ModelSummary& s, const InfoOptions& o, uint32_t ctx, CacheType chosen) {
  const ModelConfig& c = s.config;
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [name, count] : s.type_counts) types[name] = {{"tensors", count}, {"params", s.type_params.at(name)}};
  nlohmann::json kv = nlohmann::json::object();
  for (CacheType t : k_cache_types) {
    if (!cache_type_fits(t, c.n_embd_kv())) {
      kv[cache_type_name(t)] = {{"unavailable", cache_type_misfit(c.n_embd_kv())}};
      continue;
    }
    const uint64_t per_token = kv_bytes_per_token(c, t, t), per_seq = kv_cache_bytes(c, t, t, ctx, window_ring_slots(c, ctx, o.ubatch));
    kv[cache_type_name(t)] = {{"bytes_per_token", per_token},
                              {"bytes_per_seq", per_seq},
                              {"bytes_total", kv_total(per_seq, o.seqs, ctx)}};
  }
  return {
      {"file", o.model},
      {"file_size", s.file_size},
      {"gguf_version", s.gguf_version},
      {"architecture", c.arch_name},
      {"name", c.name},
      {"n_params", s.n_params},
      {"n_tensors", s.n_tensors},
      {"weight_bytes", s.weight_bytes},
      {"bits_per_weight", s.bits_per_weight()},
      {"tensor_types", types},
      {"context_length", c.n_ctx_train},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_head_kv", c.n_head_kv},
      {"head_dim", c.head_dim},
      {"n_embd", c.n_embd},
      {"n_ff", c.n_ff},
      {"n_vocab", c.n_vocab},
      {"tokenizer_model", c.tokenizer_model},
      {"has_chat_template", c.has_chat_template},
      {"rope", {{"style", c.rope_style == RopeStyle::NeoX ? "neox" : "normal"},
                {"n_rot", c.n_rot},
                {"freq_base", c.rope_freq_base},
                {"freq_scale", c.rope_freq_scale},
                {"yarn", c.yarn_ext_factor > 0.0f ? nlohmann::json{{"ext_factor", c.yarn_ext_factor}, {"orig_ctx", c.n_ctx_orig_yarn}, {"scaled_ctx", c.n_ctx_rope()}} : nlohmann::json()}}},
      {"sliding_window", {{"window", c.has_swa() ? c.n_swa : 0}, {"window_layers", window_layers(c)}}},
      {"kv_cache", {{"ctx", ctx}, {"window_ring_slots", window_ring_slots(c, ctx, o.ubatch)}, {"seqs", o.seqs}, {"cache_type", cache_type_name(chosen)}, {"types", kv},
                    {"cpu_rotated_k_bytes_per_seq", rotated_k_copy_bytes(c, ctx)}}},
  };
}

void print_human(const ModelSummary& s, const InfoOptions& o, uint32_t ctx, CacheType chosen) {
  const ModelConfig& c = s.config;
  std::printf("file            %s (%s, GGUF v%u)\n", o.model.c_str(), human_bytes(s.file_size).c_str(), s.gguf_version);
  std::printf("architecture    %s%s%s\n", c.arch_name.c_str(), c.name.empty() ? "" : " · ", c.name.c_str());
  std::printf("parameters      %s (%s), %.2f bits per weight\n", human_count(s.n_params).c_str(),
              with_commas(s.n_params).c_str(), s.bits_per_weight());
  std::printf("tensor types   ");
  for (const auto& [name, count] : s.type_counts) std::printf(" %s×%llu", name.c_str(), (unsigned long long)count);
  std::printf("\n");
  std::printf("context         %s tokens (trained", with_commas(c.n_ctx_train).c_str());
  if (c.n_ctx_rope() != c.n_ctx_train) std::printf("; %s with its YaRN scaling", with_commas(c.n_ctx_rope()).c_str());
  std::printf(")\n");
  std::printf("layers          %u\n", c.n_layer);
  std::printf("heads           %u (KV heads %u, head dim %u)\n", c.n_head, c.n_head_kv, c.head_dim);
  std::printf("embedding       %u (feed-forward %u)\n", c.n_embd, c.n_ff);
  std::printf("rope            %s, %u dims, base %g, scale %g", c.rope_style == RopeStyle::NeoX ? "neox" : "normal", c.n_rot,
              c.rope_freq_base, c.rope_freq_scale);
  if (c.yarn_ext_factor > 0.0f) std::printf(" (YaRN from an original context of %s)", with_commas(c.n_ctx_orig_yarn).c_str());
  std::printf("\n");
  if (c.has_swa())
    std::printf("attention       sliding window of %s tokens on %u of %u layers (the others see the whole context)\n",
                with_commas(c.n_swa).c_str(), window_layers(c), c.n_layer);
  std::printf("vocabulary      %s tokens (%s)\n", with_commas(c.n_vocab).c_str(),
              c.tokenizer_model.empty() ? "no tokenizer" : c.tokenizer_model.c_str());
  std::printf("chat template   %s\n", c.has_chat_template ? "yes" : "no");
  std::printf("\nKV cache: %u layers × 2 (K, V) × %u KV heads × %u head dim per token\n", c.n_layer, c.n_head_kv, c.head_dim);
  std::printf("  %-6s %14s %14s %14s\n", "type", "per token", ("× " + with_commas(ctx) + " tok").c_str(),
              ("× " + std::to_string(o.seqs) + " seq").c_str());
  for (CacheType t : k_cache_types) {
    if (!cache_type_fits(t, c.n_embd_kv())) {
      std::printf("  %-6s unavailable: %s\n", cache_type_name(t), cache_type_misfit(c.n_embd_kv()).c_str());
      continue;
    }
    const uint64_t per_token = kv_bytes_per_token(c, t, t), per_seq = kv_cache_bytes(c, t, t, ctx, window_ring_slots(c, ctx, o.ubatch));
    std::printf("%s %-6s %14s %14s %14s\n", t == chosen ? "*" : " ", cache_type_name(t), human_bytes(per_token).c_str(),
                human_bytes(per_seq).c_str(), human_bytes(kv_total(per_seq, o.seqs, ctx)).c_str());
  }
  if (const uint64_t copy = chosen == CacheType::F16 ? rotated_k_copy_bytes(c, ctx) : 0)
    std::printf("  CPU drivers (lavapipe): an f16 K cache adds a copy of K rotated by RoPE, %s per seq (%s in all)\n",
                human_bytes(copy).c_str(), human_bytes(kv_total(copy, o.seqs, ctx)).c_str());
  if (const uint32_t ring = window_ring_slots(c, ctx, o.ubatch))
    std::printf("  per token: every layer; × tokens: the %u window layers keep only a ring of %s slots each (window %s\n"
                "  + one %u-token prefill chunk%s), the %u global layers all %s\n",
                window_layers(c), with_commas(ring).c_str(), with_commas(c.n_swa).c_str(), o.ubatch,
                o.ubatch_given ? "" : ", a GPU's default; CPU drivers take 64: --ubatch 64", c.n_layer - window_layers(c),
                with_commas(ctx).c_str());
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand("info", "Describe a GGUF model and the memory its KV cache needs");
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required();
  cmd->add_flag("--json", o->json, "Print one JSON object instead of text");
  cmd->add_option("--ctx", o->ctx, "Tokens per conversation for the KV total (default: trained context)")->check(CLI::Range(0u, k_max_ctx));
  cmd->add_option("--seqs", o->seqs, "Conversations held at once")->check(CLI::Range(1u, 1000000u));
  cmd->add_option("--ubatch", o->ubatch,
                  "Prompt tokens per prefill chunk, which sizes a sliding-window model's rings (default: 512, a GPU's; "
                  "CPU drivers take 64)")
      ->check(CLI::Range(1u, 8192u));
  cmd->add_option("--cache-type", o->cache_type, "KV cache type to highlight: f16, q8_0, q4_0")
      ->check(cache_type_names());
  cmd->callback([o, cmd] {
    o->ubatch_given = cmd->count("--ubatch") > 0;
    const gguf::File f = gguf::File::open(o->model);
    const ModelSummary s = summarize_model(f);
    const uint32_t ctx = o->ctx ? o->ctx : s.config.n_ctx_train;
    const CacheType chosen = *cache_type_from_name(o->cache_type);
    if (!cache_type_fits(chosen, s.config.n_embd_kv()))
      throw Error("--cache-type " + o->cache_type + " " + cache_type_misfit(s.config.n_embd_kv()));
    // Refused before anything is printed: f16 is the largest type.
    kv_total(kv_cache_bytes(s.config, CacheType::F16, CacheType::F16, ctx, window_ring_slots(s.config, ctx, o->ubatch)), o->seqs, ctx);
    if (o->json) std::printf("%s\n", to_json(s, *o, ctx, chosen).dump(1).c_str());
    else print_human(s, *o, ctx, chosen);
  });
}

}  // namespace vkllm::cli
