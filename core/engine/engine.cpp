// The forward pass, recorded top to bottom, and the chunking of prompts into command buffers.
#include "engine/engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/ops.h"

namespace vkllm {
namespace {

constexpr uint64_t F = sizeof(float);

uint32_t logits_rows_for(const VulkanContext& ctx, const ModelConfig& c, uint32_t n_ubatch) {
  const uint64_t per_row = uint64_t{c.n_vocab} * F;
  return static_cast<uint32_t>(std::clamp<uint64_t>(ctx.max_storage_range() / per_row, 1, n_ubatch));
}

// The options with the prefill chunk resolved (0: the device's), and the rotated copy of K kept
// where the decode kernel reads it: CPU drivers, an f16 K cache, a capacity it runs at, and a rope
// table of twice the capacity that one dispatch fills (a workgroup row per position).
EngineOptions resolved(const VulkanContext& ctx, const ModelConfig& c, EngineOptions o) {
  if (o.n_ubatch == 0) o.n_ubatch = default_ubatch(ctx);
  o.cache.n_ubatch = o.n_ubatch;
  const AttentionShape shape{c.n_head, c.n_head_kv, c.head_dim, o.attention};
  o.cache.rotated_k = o.rotated_k && o.cache.type_k == CacheType::F16 && decode_kernels_fit(ctx, shape, o.cache.capacity) &&
                      rotated_copy_table_fits(o.cache.capacity, ctx.limits().maxComputeWorkGroupCount[1]);
  return o;
}

// The window layers rotate with their own base or scale (gemma3), so they need their own table.
bool has_swa_rope(const ModelConfig& c) {
  return c.has_swa() && (c.rope_freq_base_swa != c.rope_freq_base || c.rope_freq_scale_swa != c.rope_freq_scale);
}

uint64_t round_up(uint64_t n, uint64_t align) { return (n + align - 1) / align * align; }

// Where the regions of the q|k|v and gate|up buffers start: offsets every binding accepts.
uint64_t region_alignment(const VulkanContext& ctx) { return std::max<uint64_t>(ctx.limits().minStorageBufferOffsetAlignment, 256); }

// A buffer of regions one after another, each at a binding-aligned offset: where each starts, and
// the buffer's size.
struct Regions {
  std::vector<uint64_t> at;
  uint64_t bytes = 0;
};

Regions regions_of(const VulkanContext& ctx, std::initializer_list<uint64_t> sizes) {
  Regions r;
  for (uint64_t size : sizes) {
    r.at.push_back(r.bytes);
    r.bytes += round_up(size, region_alignment(ctx));
  }
  return r;
}

// The q|k|v buffer: [ub][n_head · head_dim], [ub][n_embd_kv] and [ub][n_embd_kv] floats.
Regions qkv_regions(const VulkanContext& ctx, const ModelConfig& c, uint64_t ub) {
  return regions_of(ctx, {ub * c.n_head * c.head_dim * F, ub * c.n_embd_kv() * F, ub * c.n_embd_kv() * F});
}

// The gate|up buffer: two regions of [ub][n_ff] floats.
Regions ffn_regions(const VulkanContext& ctx, const ModelConfig& c, uint64_t ub) {
  return regions_of(ctx, {ub * c.n_ff * F, ub * c.n_ff * F});
}

// Floats of an engine's attention scratch: a decode step, or a query group of a prefill chunk.
uint64_t attention_scratch(const VulkanContext& ctx, const ModelConfig& c, uint32_t capacity) {
  const AttentionShape shape{c.n_head, c.n_head_kv, c.head_dim};
  return attention_scratch_floats(shape, capacity, attention_query_group(ctx, shape, capacity), attention_alone_group(ctx));
}

}  // namespace

// The RoPE table: a (cos, sin) pair of floats per position and rotated pair.
uint64_t rope_table_bytes(const ModelConfig& c, const KvCacheOptions& cache) {
  return uint64_t{rope_positions_for(cache)} * c.head_dim / 2 * 2 * F;
}

uint32_t default_ubatch(const VulkanContext& ctx) { return ctx.info().type == "cpu" ? 64 : 512; }

MemoryPlan plan_memory(const VulkanContext& ctx, const ModelConfig& c, uint64_t weight_bytes, const EngineOptions& options) {
  const EngineOptions o = resolved(ctx, c, options);
  MemoryPlan m;
  m.weights = weight_bytes;
  const uint32_t ring = window_ring_for(c, o.cache);
  m.kv_cache = kv_cache_bytes(c, o.cache.type_k, o.cache.type_v, o.cache.capacity, ring);
  if (o.cache.rotated_k) {  // the rotated copy of K: the layers that read the global slots
    uint64_t layers = 0;
    for (uint32_t l = 0; l < c.n_layer; ++l) layers += ring && c.is_swa(l) ? 0 : 1;
    m.kv_cache += layers * o.cache.capacity * cache_row_bytes(CacheType::F16, c.n_embd_kv());
  }
  // The buffers the Engine constructor allocates, with the same sizes.
  const uint64_t ub = o.n_ubatch, qd = uint64_t{c.n_head} * c.head_dim;
  const uint64_t rows = logits_rows_for(ctx, c, static_cast<uint32_t>(ub));
  m.activations = qkv_regions(ctx, c, ub).bytes + ffn_regions(ctx, c, ub).bytes +
                  F * (ub * c.n_embd + ub * std::max<uint64_t>(c.n_embd, qd) + ub * qd + rows * c.n_embd +
                       attention_scratch(ctx, c, o.cache.capacity) + rows * c.n_vocab) +
                  rope_table_bytes(c, o.cache) * (has_swa_rope(c) ? 2 : 1) +
                  3 * ub * 4 + 2 * uint64_t{o.cache.capacity} * 4 + (ring ? ub * 4 + 2 * uint64_t{ring} * 4 : 0) +
                  (o.cache.rotated_k ? ub * 4 + uint64_t{o.cache.capacity} * 4 : 0);
  const uint64_t row = std::max(cache_row_bytes(o.cache.type_k, c.n_embd_kv()), cache_row_bytes(o.cache.type_v, c.n_embd_kv()));
  m.largest_binding = std::max(uint64_t{o.cache.capacity} * row, rope_table_bytes(c, o.cache));
  return m;
}

Engine::Engine(const VulkanContext& ctx, Pipelines& pipelines, const Model& model, const EngineOptions& o)
    : ctx_(ctx), model_(model), opts_(resolved(ctx, model.config(), o)), cache_(ctx, model.config(), opts_.cache),
      rec_(ctx, &pipelines, o.profile ? 4096 : 0) {
  const ModelConfig& c = model.config();
  const uint64_t ub = opts_.n_ubatch, qd = uint64_t{c.n_head} * c.head_dim;
  logits_rows_ = logits_rows_for(ctx, c, opts_.n_ubatch);
  auto dev = [&](uint64_t bytes, const char* name) {
    activation_bytes_ += bytes;
    return Buffer(ctx, bytes, MemoryUse::Device, name);
  };
  auto host = [&](uint64_t bytes, const char* name) {
    activation_bytes_ += bytes;
    return Buffer(ctx, bytes, MemoryUse::Upload, name);
  };
  x_ = dev(ub * c.n_embd * F, "x");
  xn_ = dev(ub * std::max<uint64_t>(c.n_embd, qd) * F, "xn");
  // Regions of one buffer, each starting at a binding-aligned offset.
  const uint64_t q_bytes = ub * qd * F, kv_bytes = ub * c.n_embd_kv() * F, ff_bytes = ub * c.n_ff * F;
  const Regions qkv = qkv_regions(ctx, c, ub), ffn = ffn_regions(ctx, c, ub);
  qkv_ = dev(qkv.bytes, "q|k|v");
  q_ = qkv_.view(qkv.at[0], q_bytes);
  k_ = qkv_.view(qkv.at[1], kv_bytes);
  v_ = qkv_.view(qkv.at[2], kv_bytes);
  attn_ = dev(ub * qd * F, "attn");
  ffn_ = dev(ffn.bytes, "gate|up");
  gate_ = ffn_.view(ffn.at[0], ff_bytes);
  up_ = ffn_.view(ffn.at[1], ff_bytes);
  out_rows_ = dev(uint64_t{logits_rows_} * c.n_embd * F, "out rows");
  const uint64_t table_bytes = rope_table_bytes(c, opts_.cache);
  // The table is one binding (the K rows' own limit is checked by the cache).
  if (table_bytes > ctx.max_storage_range())
    throw Error("--ctx " + std::to_string(cache_.capacity()) + " needs a RoPE table of " + std::to_string(table_bytes) + " bytes, more than one binding of " +
                ctx.info().name + " can hold (" + std::to_string(ctx.max_storage_range()) + "); use --ctx " +
                std::to_string(ctx.max_storage_range() / (uint64_t{c.head_dim} * F) / 256 * 256) + " or less");
  rope_table_ = dev(table_bytes, "rope table");
  if (has_swa_rope(c)) rope_table_swa_ = dev(table_bytes, "rope table (window layers)");
  scratch_ = dev(attention_scratch(ctx, c, cache_.capacity()) * F, "attention scratch");
  ids_ = host(ub * 4, "ids");
  pos_ = host(ub * 4, "pos");
  slots_ = host(ub * 4, "slots");
  kv_slots_ = host(uint64_t{cache_.capacity()} * 4, "kv slots");
  kv_pos_ = host(uint64_t{cache_.capacity()} * 4, "kv pos");
  if (opts_.cache.rotated_k) {
    rot_ = host(ub * 4, "rotation positions");
    kv_rot_ = host(uint64_t{cache_.capacity()} * 4, "kv rotation positions");
  }
  if (const uint32_t ring = cache_.window_ring()) {
    slots_win_ = host(ub * 4, "window slots");
    kv_slots_win_ = host(uint64_t{ring} * 4, "window kv slots");
    kv_pos_win_ = host(uint64_t{ring} * 4, "window kv pos");
  }
  logits_dev_ = Buffer(ctx, uint64_t{logits_rows_} * c.n_vocab * F, MemoryUse::Readback, "logits");
  activation_bytes_ += logits_dev_.size();
}

void Engine::record_forward(std::span<const Member> members, uint32_t n, uint32_t out_begin, uint32_t n_out, bool log_probs,
                            MatmulKernel kernel) {
  const ModelConfig& c = model_.config();
  const Weights& w = model_.weights();
  CommandRecorder& rec = rec_;
  const uint32_t qd = c.n_head * c.head_dim, kvd = c.n_embd_kv();
  const RopeConfig rope_global = rope_config(false), rope_swa = rope_config(true);
  const BufferView x = x_.view(), xn = xn_.view(), q = q_, k = k_, v = v_;
  const BufferView attn = attn_.view(), gate = gate_, up = up_;

  // Embedding: x = tok_embd[ids] (· √n_embd for Gemma); the first time, the RoPE angles of every
  // position the cache can hold (positions stay below its capacity, so the tables never change)
  record_get_rows(rec, w.tok_embd, ids_.view(), n, x, c.n_embd);
  if (!rope_table_filled_) {
    record_rope_table(rec, rope_table_.view(), rope_positions_for(opts_.cache), rope_global);
    if (rope_table_swa_.size()) record_rope_table(rec, rope_table_swa_.view(), rope_positions_for(opts_.cache), rope_swa);
  }
  rec.barrier();
  // A rotated copy of K rebuilt from the cache (after a restore or a rebase), before anything reads it.
  if (std::any_of(members.begin(), members.end(), [](const Member& m) { return m.seq->cache_.rotated_stale(); })) {
    for (const Member& m : members) m.seq->record_rotated_rebuild(rec, *this);
    rec.barrier();
  }
  if (c.embd_scale != 1.0f) {
    record_scale(rec, x, x, n * c.n_embd, c.embd_scale);
    rec.barrier();
  }
  const bool batched = batch_step_fits(members);
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = w.layers[l];
    // Attention block: xn = rms_norm(x) · attn_norm
    record_rms_norm(rec, x, c.n_embd, L.attn_norm.whole(), xn, c.n_embd, n, c.n_embd, c.rms_eps);
    rec.barrier();
    // q, k, v projections (+ biases for qwen2)
    if (!L.wqkv.parts.empty()) {
      const BufferView outs[] = {q, k, v};
      const uint32_t rows[] = {qd, kvd, kvd};
      record_matmul_split(rec, L.wqkv, xn, c.n_embd, n, outs, rows, kernel);
    } else {
      record_matmul(rec, L.wq, xn, c.n_embd, n, q, qd, MatmulStore::Overwrite, kernel);
      record_matmul(rec, L.wk, xn, c.n_embd, n, k, kvd, MatmulStore::Overwrite, kernel);
      record_matmul(rec, L.wv, xn, c.n_embd, n, v, kvd, MatmulStore::Overwrite, kernel);
    }
    rec.barrier();
    if (c.qkv_bias) {
      record_add(rec, q, L.bq.whole(), q, n * qd, qd);
      record_add(rec, k, L.bk.whole(), k, n * kvd, kvd);
      record_add(rec, v, L.bv.whole(), v, n * kvd, kvd);
      rec.barrier();
    }
    if (c.qk_norm) {  // qwen3: every head of q and k RMS-normed on its own, before RoPE
      record_rms_norm(rec, q, c.head_dim, L.q_norm.whole(), q, c.head_dim, n * c.n_head, c.head_dim, c.rms_eps);
      record_rms_norm(rec, k, c.head_dim, L.k_norm.whole(), k, c.head_dim, n * c.n_head_kv, c.head_dim, c.rms_eps);
      rec.barrier();
    }
    // Store k and v at their slots (both un-rotated: attention rotates q and k by RoPE as it reads
    // them), and attend, each sequence of the batch in its own cache (a decode step's sequences k
    // at a time where the device takes it).
    if (batched && !c.is_swa(l)) {
      record_batch_step(members, l);
    } else {
      for (const Member& m : members) m.seq->record_kv_store_of(rec, l, *this, m.first, m.n);
      rec.barrier();
      for (const Member& m : members) m.seq->record_attention_of(rec, l, *this, m.first, m.n, kernel == MatmulKernel::Columns);
    }
    rec.barrier();
    // Output projection and residual: x += wo · attn (Gemma: x += rms_norm(wo · attn) · attn_post_norm)
    record_residual(L.wo, attn, qd, n, L.attn_post_norm, kernel);
    // Feed-forward block: xn = rms_norm(x) · ffn_norm; x += w_down · (act(w_gate · xn) ⊙ (w_up · xn)),
    // act SiLU (or tanh GELU for Gemma, whose output is normed like the attention's)
    record_rms_norm(rec, x, c.n_embd, L.ffn_norm.whole(), xn, c.n_embd, n, c.n_embd, c.rms_eps);
    rec.barrier();
    const Glu act = c.gelu_ffn ? Glu::GELU : Glu::SiLU;
    if (!L.w_gate_up.parts.empty()) {
      record_matmul_glu(rec, L.w_gate_up, xn, c.n_embd, n, gate, up, gate, act, kernel);
    } else {
      record_matmul(rec, L.w_gate, xn, c.n_embd, n, gate, c.n_ff, MatmulStore::Overwrite, kernel);
      record_matmul(rec, L.w_up, xn, c.n_embd, n, up, c.n_ff, MatmulStore::Overwrite, kernel);
      rec.barrier();
      record_glu(rec, act, gate, up, gate, n * c.n_ff);
    }
    rec.barrier();
    record_residual(L.w_down, gate, c.n_ff, n, L.ffn_post_norm, kernel);
  }
  if (n_out == 0) return;
  // Logits for the rows that need them: copy those rows out, final norm, output projection.
  rec.copy(x_.view(uint64_t{out_begin} * c.n_embd * F, uint64_t{n_out} * c.n_embd * F),
           out_rows_.view(0, uint64_t{n_out} * c.n_embd * F));
  rec.barrier();
  record_rms_norm(rec, out_rows_.view(), c.n_embd, w.output_norm.whole(), out_rows_.view(), c.n_embd, n_out, c.n_embd,
                  c.rms_eps);
  rec.barrier();
  record_matmul(rec, w.output, out_rows_.view(), c.n_embd, n_out, logits_dev_.view(), c.n_vocab, MatmulStore::Overwrite, kernel);
  if (c.final_softcap > 0.0f) {
    rec.barrier();
    record_softcap(rec, logits_dev_.view(), logits_dev_.view(), n_out * c.n_vocab, c.final_softcap);
  }
  if (log_probs) {
    rec.barrier();
    record_log_softmax(rec, logits_dev_.view(), logits_dev_.view(), n_out, c.n_vocab);
  }
}

void Engine::record_kv_store_of(CommandRecorder& rec, uint32_t l, const Engine& pass, uint32_t first, uint32_t n) const {
  const ModelConfig& c = model_.config();
  const uint32_t kvd = c.n_embd_kv();
  const uint64_t at = uint64_t{first} * kvd * F, bytes = uint64_t{n} * kvd * F;
  const bool ring = c.is_swa(l) && cache_.window_ring();
  const BufferView store_slots = ring ? slots_win_.view() : slots_.view();
  // (A window layer with its own ring stores at its ring's slots.)
  record_kv_store_pair(rec, cache_.type_k(), cache_.type_v(), pass.k_.sub(at, bytes), pass.v_.sub(at, bytes), kvd, store_slots, n,
                       kvd, cache_.k(l).view(), cache_.v(l).view(), rotated_k(l, pass, rot_.view(0, uint64_t{n} * 4), 0));
}

RotatedK Engine::rotated_k(uint32_t l, const Engine& pass, const BufferView& rot, uint32_t split) const {
  const Buffer* rows = cache_.k_rotated(l);
  if (!rows) return {};
  const bool swa = model_.config().is_swa(l);
  const BufferView table = swa && pass.rope_table_swa_.size() ? pass.rope_table_swa_.view() : pass.rope_table_.view();
  return RotatedK{rows->view(), rot, table, rope_config(swa), split};
}

void Engine::record_rotated_rebuild(CommandRecorder& rec, const Engine& pass) const {
  if (!cache_.rotated_stale()) return;
  const ModelConfig& c = model_.config();
  for (uint32_t l = 0; l < c.n_layer; ++l)
    if (const RotatedK r = rotated_k(l, pass, kv_rot_.view(0, uint64_t{n_kv_listed_} * 4), 0); r.rows.buffer && n_kv_listed_ > 0)
      record_kv_rotate(rec, cache_.k(l).view(), kv_slots_.view(0, uint64_t{n_kv_listed_} * 4), n_kv_listed_, c.n_embd_kv(), r);
}

void Engine::record_attention_of(CommandRecorder& rec, uint32_t l, const Engine& pass, uint32_t first, uint32_t n,
                                 bool per_query) const {
  const ModelConfig& c = model_.config();
  const uint32_t qd = c.n_head * c.head_dim;
  const bool swa = c.is_swa(l);
  const RopeConfig rope = rope_config(swa);
  // The rope tables are the same in every engine of one model and options: the pass's is filled.
  const BufferView rope_table = swa && pass.rope_table_swa_.size() ? pass.rope_table_swa_.view() : pass.rope_table_.view();
  AttentionShape shape = attention_shape(swa);
  // attn = softmax(q kᵀ / √d) v over every live slot (k rotated as read), causal by position
  // A window layer sharing the global slots reads only the suffix of the slot list its queries
  // can see (the list is in logical order and a token's position is its logical index); one with
  // its own ring reads its ring's list.
  const bool ring = swa && cache_.window_ring();
  const uint32_t list_first = swa && !ring ? window_list_start(n) : 0;
  const uint32_t n_kv = ring ? n_kv_window_ : n_kv_listed_ - list_first;
  // Columns (a verify pass, a batched step): each query token's attention is what it is alone, and
  // alone its list would start where window_list_start(1), or the ring's list, starts it.
  shape.per_query = per_query;
  shape.list_pos0 = n_kv_listed_ - n_kv;
  const BufferView list_slots = ring ? kv_slots_win_.view(0, uint64_t{n_kv} * 4) : kv_slots_.view(uint64_t{list_first} * 4, uint64_t{n_kv} * 4);
  const BufferView list_pos = ring ? kv_pos_win_.view(0, uint64_t{n_kv} * 4) : kv_pos_.view(uint64_t{list_first} * 4, uint64_t{n_kv} * 4);
  const uint64_t at = uint64_t{first} * qd * F, bytes = uint64_t{n} * qd * F;
  // The rotated copy's list is the global one's suffix, so its split moves with the suffix.
  const RotatedK rotated = ring ? RotatedK{}
                                : rotated_k(l, pass, kv_rot_.view(uint64_t{list_first} * 4, uint64_t{n_kv} * 4),
                                            rot_split_ > list_first ? rot_split_ - list_first : 0);
  record_attention(rec, cache_.type_k(), shape, rope, rope_table, pass.q_.sub(at, bytes), qd, pos_.view(), n, cache_.k(l).view(),
                   cache_.v(l).view(), list_slots, list_pos, n_kv, pass.attn_.view(at, bytes), qd, scratch_.view(), rotated);
}

bool Engine::batch_step_fits(std::span<const Member> members) const {
  if (members.size() < 2) return false;
  // (can_batch_with gave the members one model, capacity and rotated-copy option; their cache
  // types may still differ, and every one must be f16.)
  uint32_t max_kv = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    if (m.n != 1 || m.first != i || m.seq->cache_.type_k() != cache_.type_k() || m.seq->cache_.type_v() != cache_.type_v())
      return false;
    max_kv = std::max(max_kv, m.seq->n_kv_listed_);
  }
  const AttentionShape shape = attention_shape(false);
  return batch_attention_fits(ctx_, cache_.type_k(), cache_.type_v(), shape, rope_config(false), max_kv);
}

void Engine::record_batch_step(std::span<const Member> members, uint32_t l) {
  const ModelConfig& c = model_.config();
  const uint32_t qd = c.n_head * c.head_dim, kvd = c.n_embd_kv();
  const AttentionShape shape = attention_shape(false);
  std::vector<SeqAttention> seqs;
  for (const Member& m : members) {
    const Engine& e = *m.seq;
    const uint64_t list = uint64_t{e.n_kv_listed_} * 4;
    seqs.push_back(SeqAttention{e.slots_.view(0, 4), e.pos_.view(0, 4), e.cache_.k(l).view(), e.cache_.v(l).view(),
                                e.kv_slots_.view(0, list), e.kv_pos_.view(0, list), e.n_kv_listed_,
                                e.rotated_k(l, *this, e.rot_.view(0, 4), 0)});
  }
  // Sequence i's rows are row i of the pass's k, v, q and attention output.
  const auto rows = [](const BufferView& v, uint32_t first, uint32_t n, uint32_t width) {
    return v.sub(uint64_t{first} * width * F, uint64_t{n} * width * F);
  };
  for (uint32_t g = 0; g < seqs.size(); g += k_batch_seqs) {
    const uint32_t n = std::min<uint32_t>(k_batch_seqs, static_cast<uint32_t>(seqs.size()) - g);
    record_batch_kv_store(rec_, rows(k_, g, n, kvd), rows(v_, g, n, kvd), kvd, kvd, std::span(seqs).subspan(g, n));
  }
  rec_.barrier();
  for (uint32_t g = 0; g < seqs.size(); g += k_batch_seqs) {
    const uint32_t n = std::min<uint32_t>(k_batch_seqs, static_cast<uint32_t>(seqs.size()) - g);
    record_batch_attention(rec_, shape, rope_config(false), rope_table_.view(), rows(q_, g, n, qd), qd,
                           rows(attn_.view(), g, n, qd), qd, std::span(seqs).subspan(g, n));
  }
}

uint32_t Engine::window_list_start(uint32_t n) const {
  const ModelConfig& c = model_.config();
  // From the chunk's first position's window, rounded down so the bound views start at an offset
  // the device accepts.
  return window_list_first(n_kv_listed_ - n, c.n_swa, list_align());
}

uint32_t Engine::list_align() const {
  return static_cast<uint32_t>(std::max<uint64_t>(ctx_.limits().minStorageBufferOffsetAlignment / 4, 1));
}

AttentionShape Engine::attention_shape(bool swa) const {
  const ModelConfig& c = model_.config();
  AttentionShape shape{c.n_head, c.n_head_kv, c.head_dim, opts_.attention, c.attn_scale, c.attn_softcap, swa ? c.n_swa : 0};
  // Where a lone token's window list starts (window_list_start): a view's offset alignment into the
  // global list, any entry of a window ring's own list.
  shape.list_align = swa && !cache_.window_ring() ? list_align() : 1;
  return shape;
}

RopeConfig Engine::rope_config(bool swa) const {
  const ModelConfig& c = model_.config();
  const DeviceTensor* factors = model_.rope_factors(cache_.capacity());
  return RopeConfig{c.head_dim,
                    c.n_rot,
                    swa ? c.rope_freq_base_swa : c.rope_freq_base,
                    swa ? c.rope_freq_scale_swa : c.rope_freq_scale,
                    c.rope_style == RopeStyle::NeoX,
                    factors ? factors->whole() : BufferView{},
                    c.rope_mscale(swa),
                    c.yarn_ext_factor,
                    c.n_ctx_orig_yarn,
                    c.yarn_beta_fast,
                    c.yarn_beta_slow};
}

void Engine::record_residual(const DeviceTensor& w, const BufferView& in, uint32_t in_stride, uint32_t n,
                             const DeviceTensor& post_norm, MatmulKernel kernel) {
  const ModelConfig& c = model_.config();
  const BufferView x = x_.view(), xn = xn_.view();
  if (!c.post_norms) {
    record_matmul(rec_, w, in, in_stride, n, x, c.n_embd, MatmulStore::Accumulate, kernel);
    rec_.barrier();
    return;
  }
  record_matmul(rec_, w, in, in_stride, n, xn, c.n_embd, MatmulStore::Overwrite, kernel);
  rec_.barrier();
  record_rms_norm(rec_, xn, c.n_embd, post_norm.whole(), xn, c.n_embd, n, c.n_embd, c.rms_eps);
  rec_.barrier();
  record_add(rec_, x, xn, x, n * c.n_embd, n * c.n_embd);
  rec_.barrier();
}

std::vector<int32_t> Engine::stage(std::span<const int32_t> tokens) {
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  std::vector<int32_t> positions, kv_slots, kv_pos;
  const std::vector<int32_t> slots = cache_.append(tokens, positions);
  cache_.attention_lists(kv_slots, kv_pos);
  n_kv_listed_ = static_cast<uint32_t>(kv_slots.size());
  std::memcpy(ids_.mapped(), tokens.data(), n * 4);
  std::memcpy(pos_.mapped(), positions.data(), n * 4);
  std::memcpy(slots_.mapped(), slots.data(), n * 4);
  std::memcpy(kv_slots_.mapped(), kv_slots.data(), kv_slots.size() * 4);
  std::memcpy(kv_pos_.mapped(), kv_pos.data(), kv_pos.size() * 4);
  if (opts_.cache.rotated_k) {
    std::vector<int32_t> kv_rot;
    rot_split_ = cache_.rotation_list(kv_rot);
    std::memcpy(kv_rot_.mapped(), kv_rot.data(), kv_rot.size() * 4);
    const std::vector<int32_t> rot = cache_.rotations_of_last(n);
    std::memcpy(rot_.mapped(), rot.data(), n * 4);
  }
  if (cache_.window_ring()) {
    const std::vector<int32_t> win_slots = cache_.window_slots_of_last(n);
    cache_.window_lists(n, kv_slots, kv_pos);
    n_kv_window_ = static_cast<uint32_t>(kv_slots.size());
    std::memcpy(slots_win_.mapped(), win_slots.data(), n * 4);
    std::memcpy(kv_slots_win_.mapped(), kv_slots.data(), kv_slots.size() * 4);
    std::memcpy(kv_pos_win_.mapped(), kv_pos.data(), kv_pos.size() * 4);
  }
  return positions;
}

void Engine::check_tokens(std::span<const int32_t> tokens) const {
  const ModelConfig& c = model_.config();
  for (int32_t t : tokens)
    if (t < 0 || uint32_t(t) >= c.n_vocab)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(c.n_vocab - 1) + ")");
}

void Engine::run_pass(std::span<const Member> members, uint32_t n, uint32_t n_out, bool log_probs, MatmulKernel kernel) {
  record_forward(members, n, n - n_out, n_out, log_probs, kernel);
  rec_.submit_and_wait();
  rope_table_filled_ = true;
  for (const Member& m : members) m.seq->cache_.rotated_rebuilt();  // (a no-op where none was stale)
  for (const DispatchTiming& t : rec_.timings()) timings_.push_back(t);
  const float* src = static_cast<const float*>(logits_dev_.mapped());
  logits_.insert(logits_.end(), src, src + uint64_t{n_out} * model_.config().n_vocab);
}

void Engine::run_chunk(std::span<const int32_t> tokens, uint32_t n_out, bool log_probs) {
  check_tokens(tokens);
  stage(tokens);
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const Member self{this, 0, n};
  run_pass(std::span(&self, 1), n, n_out, log_probs);
}

bool Engine::can_batch_with(const Engine& other) const {
  // (The members read the pass engine's rope tables, which cover the rotated copy's positions only
  // where it has one.)
  return &other.model_ == &model_ && &other.ctx_ == &ctx_ && other.cache_.capacity() == cache_.capacity() &&
         other.opts_.attention == opts_.attention && other.opts_.cache.rotated_k == opts_.cache.rotated_k;
}

bool Engine::can_decode_batch(std::span<Engine* const> seqs, std::span<const uint32_t> counts) const {
  const ModelConfig& c = model_.config();
  const uint64_t align = std::max<uint64_t>(ctx_.limits().minStorageBufferOffsetAlignment, 4);
  if (seqs.empty() || seqs[0] != this || (!counts.empty() && counts.size() != seqs.size())) return false;
  uint64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const uint32_t n = counts.empty() ? 1 : counts[i];
    if (n == 0 || (n > 1 && n > seqs[i]->max_chunk(true))) return false;
    total += n;
  }
  if (total > max_batch_tokens()) return false;
  if (uint64_t{c.n_embd_kv()} * F % align != 0 || uint64_t{c.n_head} * c.head_dim * F % align != 0) return false;
  return std::all_of(seqs.begin(), seqs.end(), [&](const Engine* e) { return can_batch_with(*e); });
}

const std::vector<float>& Engine::decode_batch(std::span<Engine* const> seqs, std::span<const int32_t> tokens,
                                               std::span<const uint32_t> counts) {
  const uint32_t k = static_cast<uint32_t>(seqs.size());
  VKLLM_CHECK(!seqs.empty() && seqs[0] == this && (counts.empty() ? tokens.size() == k : counts.size() == k),
              "decode_batch: this engine first, and one token per engine or counts[i] of them");
  // Each sequence's q, k, v and output rows are bound at their own offset in this engine's buffers.
  VKLLM_CHECK(can_decode_batch(seqs, counts), "decode_batch: engines this device cannot run in one pass (check can_decode_batch)");
  check_tokens(tokens);
  logits_.clear();
  std::vector<Member> members(k);
  uint32_t first = 0;
  for (uint32_t i = 0; i < k; ++i) {
    const uint32_t n = counts.empty() ? 1 : counts[i];
    VKLLM_CHECK(first + n <= tokens.size(), "decode_batch: the counts add up to the tokens");
    seqs[i]->stage(tokens.subspan(first, n));
    members[i] = Member{seqs[i], first, n};
    first += n;
  }
  VKLLM_CHECK(first == tokens.size(), "decode_batch: the counts add up to the tokens");
  // The pass's ids hold every sequence's tokens (the embedding reads them); each member's attention
  // reads its own positions from its own upload buffer.
  std::memcpy(ids_.mapped(), tokens.data(), tokens.size() * 4);
  // Columns: every sequence's rows computed exactly as they would be alone (batch invariance).
  run_pass(members, first, first, false, MatmulKernel::Columns);
  return logits_;
}

uint32_t Engine::max_chunk(bool all_logits) const {
  // At most n_ubatch tokens, at most the logits rows when every row is wanted, and at most the
  // ring's window so a chunk never overwrites its own tokens.
  uint32_t chunk = opts_.n_ubatch;
  if (all_logits) chunk = std::min(chunk, logits_rows_);
  chunk = std::min(chunk, std::max<uint32_t>(cache_.capacity() - cache_.keep(), 1));
  // A window ring holds a chunk and the window before it.
  if (cache_.window_ring()) chunk = std::min(chunk, cache_.window_ring() - model_.config().n_swa);
  return chunk;
}

bool Engine::verify_exact() const {
  const ModelConfig& c = model_.config();
  const AttentionShape swa = attention_shape(true);
  return !c.has_swa() || attention_per_query_exact(ctx_, swa, c.n_rot);
}

const std::vector<float>& Engine::decode_columns(std::span<const int32_t> tokens) {
  VKLLM_CHECK(!tokens.empty() && tokens.size() <= max_chunk(true), "decode_columns: 1 to max_chunk(true) tokens");
  check_tokens(tokens);
  logits_.clear();
  stage(tokens);
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const Member self{this, 0, n};
  run_pass(std::span(&self, 1), n, n, false, MatmulKernel::Columns);
  return logits_;
}

const std::vector<float>& Engine::decode(std::span<const int32_t> tokens, LogitsMode mode, const ProgressFn& progress) {
  logits_.clear();
  const bool all = mode != LogitsMode::Last;
  const uint32_t chunk = max_chunk(all);
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - done);
    const bool last = done + n == tokens.size();
    run_chunk(tokens.subspan(done, n), all ? uint32_t(n) : last ? 1u : 0u, mode == LogitsMode::AllLogProbs);
    done += n;
    if (progress) progress(done, tokens.size());
  }
  return logits_;
}

}  // namespace vkllm
