// Recording of RoPE, KV cache stores and attention (with the split-KV decode path).
#include "kernels/params.h"
#include "kernels/ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

namespace vkllm {
namespace {

// Splits of the slot list for the tiled kernel (each at least 64 slots): 64 keep an H200 busy at
// 4,096 slots (8 KV heads × 64 workgroups; 16 left 128 workgroups of 256 slots, one per SM).
constexpr uint32_t k_max_split = 64;

// A BufferView to bind where a kernel declares a binding it will not read this time.
BufferView or_dummy(const BufferView& v, const BufferView& dummy) { return v.buffer ? v : dummy; }

struct AttentionTiles {
  uint32_t wg, bq, bkv;
};

// Tile sizes that fit the device's shared memory: Q tile + K (rows padded by a float, so that the
// scores' reads of different K rows fall in different banks) and V tiles + scores, f32. A tile holds
// up to as many query rows as the record has: a decode step's G rows take a tile of their own size
// (bit_ceil(G)) instead of a 16- or 32-row one that is mostly empty, and more slots per tile.
AttentionTiles attention_tiles(const VulkanContext& ctx, uint32_t head_dim, uint32_t rows) {
  const uint32_t shared = ctx.limits().maxComputeSharedMemorySize;
  // Larger tiles mean fewer barriers per score (which dominate on CPU drivers like lavapipe).
  for (uint32_t b : {32u, 16u, 8u, 4u}) {
    const uint32_t bq = std::min(b, std::bit_ceil(std::max<uint32_t>(rows, 1)));
    const uint64_t bytes = 4ull * (bq * head_dim + b * (2 * head_dim + 1) + bq * b + 4 * bq + b);
    const uint32_t wg = 128;
    if (bytes <= shared && bq * head_dim <= wg * 32) return {wg, bq, b};
  }
  throw Error("head dim " + std::to_string(head_dim) + " needs more shared memory than " + ctx.info().name + " has (" +
              std::to_string(shared) + " bytes)");
}

// attention_simd.comp unrolls its loops over rows × head dims, and LLVM's compile time grows
// steeply with that product on lavapipe (≈ 4 s at 32, ≈ 35 s at 128, paid once per variant before
// the pipeline cache holds it): rows × head_dim ≤ 64, so head dims ≤ 64 use it (one row per
// workgroup at 64, the head dim of most 1–3B models).
constexpr uint32_t k_simd_unroll = 64;

// attention_simd.comp's query rows per workgroup.
uint32_t simd_rows(uint32_t head_dim, uint32_t rows) {
  const uint32_t max_rows = std::bit_floor(std::max<uint32_t>(1, k_simd_unroll / head_dim));
  return std::min(max_rows, std::bit_ceil(std::max<uint32_t>(rows, 1)));
}

// attention_decode.comp: query tokens over at least this many slots, on CPU drivers.
constexpr uint32_t k_decode_min_kv = 256;
// The query tokens alone whose split-KV partials a GPU engine's scratch holds: a verify pass of
// the default --draft-max (16) and its sampled token.
constexpr uint32_t k_alone_group = 17;
// attention_lanes.comp keeps four head-dim rows per lane in registers, its loops over them unrolled.
constexpr uint32_t k_lanes_max_head_dim = 256;

}  // namespace

std::string attention_kernel_misfit(const VulkanContext& ctx, AttentionKernel kernel, uint32_t head_dim, uint32_t n_rot) {
  const DeviceInfo& d = ctx.info();
  const bool simd = kernel == AttentionKernel::Simd;
  if (!simd && kernel != AttentionKernel::Lanes) return {};  // tiled (and auto's choices) take every shape
  const uint32_t max_head_dim = simd ? k_simd_unroll : k_lanes_max_head_dim;
  const char* name = simd ? "attention_simd" : "attention_lanes";
  if (head_dim % 8 != 0 || head_dim > max_head_dim)
    return std::string(name) + " takes head dims that are multiples of 8 up to " + std::to_string(max_head_dim) + "; this model's is " +
           std::to_string(head_dim);
  if (n_rot % 4 != 0) return std::string(name) + " takes rotated dims that are multiples of 4; this model rotates " + std::to_string(n_rot);
  if (!d.int64) return d.name + " lacks 64-bit integers (shaderInt64), which " + name + " needs";
  if (!std::has_single_bit(d.subgroup_size))
    return std::string(name) + " needs a power-of-two subgroup size; " + d.name + "'s is " + std::to_string(d.subgroup_size);
  if (simd && !d.subgroup_shuffle) return d.name + " lacks subgroup shuffles, which attention_simd needs";
  return {};
}

namespace {

// Which kernel serves a record that the decode kernels do not take: on CPU drivers,
// attention_lanes.comp (a lane per query row, head dims ≤ 256) over lists shorter than
// k_decode_min_kv and attention_simd.comp (a lane per slot, head dims ≤ 64) over longer ones (see
// their headers); attention.comp's shared-memory tiles on GPUs and for what those do not take.
AttentionKernel attention_kernel_for(const VulkanContext& ctx, const AttentionShape& shape, uint32_t n_rot, uint32_t n_kv) {
  const std::string misfit = attention_kernel_misfit(ctx, shape.kernel, shape.head_dim, n_rot);
  VKLLM_CHECK(misfit.empty(), misfit);
  if (shape.kernel != AttentionKernel::Auto) return shape.kernel;
  if (ctx.info().type != "cpu") return AttentionKernel::Tiled;
  if (n_kv < k_decode_min_kv && attention_kernel_misfit(ctx, AttentionKernel::Lanes, shape.head_dim, n_rot).empty())
    return AttentionKernel::Lanes;
  return attention_kernel_misfit(ctx, AttentionKernel::Simd, shape.head_dim, n_rot).empty() ? AttentionKernel::Simd : AttentionKernel::Tiled;
}

// The CPU kernels' SOFTCAP specialization: whether scores are soft-capped (a branch on the push
// constant costs lavapipe its body on every lane whether taken or not).
uint32_t softcapped(const AttentionShape& shape) { return shape.softcap > 0.0f ? 1u : 0u; }

// The push constants of every attention pass (the scale defaults to 1/√head_dim).
AttentionParams attention_params(const AttentionShape& shape, const RopeConfig& rope, uint32_t n_q, uint32_t n_kv,
                                 uint32_t q_stride, uint32_t out_stride, uint32_t n_split, uint32_t kv_per_split) {
  const float scale = shape.scale > 0.0f ? shape.scale : 1.0f / std::sqrt(float(shape.head_dim));
  AttentionParams p{n_q,   n_kv,       shape.n_head, shape.n_head_kv, shape.head_dim,     q_stride,      out_stride,   n_split,
                    kv_per_split, scale, rope.n_rot,   rope.neox ? 1u : 0u, rope.attn_factor, shape.softcap, shape.window, 0};
  p.list_align = std::max<uint32_t>(shape.list_align, 1);
  return p;
}

// The query tokens an engine's scratch holds the scores of (a prefill chunk runs in groups of
// them), within k_decode_group_bytes.
constexpr uint32_t k_decode_max_group = 64;
constexpr uint64_t k_decode_group_bytes = uint64_t{64} << 20;
// Entries per scores-pass lane: each lane's block pays a prologue (q of its G heads loaded and
// rotated), so longer lists take longer blocks, as long as every KV head still has two workgroups'
// worth of lanes (docs/performance.md, "Longer blocks for longer lists").
constexpr uint32_t k_decode_per_lane = 64, k_decode_max_per_lane = 256;
uint32_t decode_per_lane(uint32_t n_kv, uint32_t sg) {
  uint32_t per_lane = k_decode_per_lane;
  while (per_lane < k_decode_max_per_lane && n_kv / (2 * per_lane) >= 2 * sg) per_lane *= 2;
  return per_lane;
}
constexpr uint32_t k_decode_dims = 32;  // the values pass's head dims per workgroup

// Floats of attention_decode's scratch per query token: [n_head_kv][n_kv + blocks][G rounded up to
// a multiple of 4], the scores of every entry then the maximum of each lane's block of (at least)
// k_decode_per_lane entries.
uint64_t decode_scores_floats(const AttentionShape& shape, uint32_t n_kv) {
  const uint32_t g = shape.n_head / shape.n_head_kv;
  // (One block more: a split of the list for the rotated copy of K may make one more.)
  return uint64_t{shape.n_head_kv} * (n_kv + div_ceil(n_kv, k_decode_per_lane) + 1) * ((g + 3) / 4 * 4);
}

// The slots of a rotated copy of K (head-major f16 rows of row_len elements).
uint32_t copy_slots(const RotatedK& rotated, uint32_t row_len) {
  return static_cast<uint32_t>(rotated.rows.range / (uint64_t{row_len} * 2));
}

// The scores pass unrolls G × head_dim multiply-adds and holds the G query heads in registers;
// lavapipe compiles it in ≈ 3 s at 512 and ≈ 22 s at 1024 (once per variant, then the pipeline
// cache holds it), so G × head_dim ≤ 512: head dim 64 up to G = 8, 128 up to 4, 256 up to 2.
constexpr uint32_t k_decode_unroll = 512;

// attention_decode.comp on CPU drivers (or where attention_simd is forced): any head dim that is a
// multiple of 32 within k_decode_unroll, decode steps over at least k_decode_min_kv slots, with
// scratch for the scores.
bool use_decode_kernels(const VulkanContext& ctx, const AttentionShape& shape, uint32_t n_q, uint32_t n_kv,
                        const BufferView& scratch) {
  return decode_kernels_fit(ctx, shape, n_kv) && n_q >= 1 && scratch.buffer &&
         scratch.range >= decode_scores_floats(shape, n_kv) * 4;
}

// The CPU-driver kernels read the rope table as 16-byte texels of two (cos, sin) pairs: the table
// on a texel view's alignment, each position's pairs starting on a texel.
void check_rope_texels(const CommandRecorder& rec, const RopeConfig& rope, const BufferView& rope_table) {
  const uint64_t texel_align = std::max<uint64_t>(rec.context().limits().minTexelBufferOffsetAlignment, 1);
  VKLLM_CHECK(rope_table.offset % texel_align == 0 && (rope.head_dim / 2) % 2 == 0,
              "attention: the rope table not on a texel boundary");
}

// Scores (a lane per slot), then values (a lane per entry, a workgroup per k_decode_dims dims)
// through scratch: see attention_decode.comp. Query tokens from `first` on, in groups of as many
// as the scratch holds scores for (grid z), the scores of one group read before the next
// overwrites them.
void record_decode_attention(CommandRecorder& rec, CacheType type, const AttentionShape& shape, const RopeConfig& rope,
                             const BufferView& rope_table, const BufferView& q, uint32_t q_stride, const BufferView& q_pos,
                             uint32_t n_q, const BufferView& k_cache, const BufferView& v_cache, const BufferView& kv_slots,
                             const BufferView& kv_pos, uint32_t n_kv, const BufferView& out, uint32_t out_stride,
                             const BufferView& scratch, const RotatedK& rotated, uint32_t first) {
  const uint32_t sg = rec.context().subgroup_size(), g = shape.n_head / shape.n_head_kv;
  const uint64_t per_query = decode_scores_floats(shape, n_kv) * 4;
  // The scores pass writes the group's scores through a storage buffer: within one binding's range.
  const uint64_t score_bytes = std::min<uint64_t>(scratch.range, rec.context().max_storage_range());
  const uint32_t group = static_cast<uint32_t>(std::clamp<uint64_t>(score_bytes / per_query, 1, n_q));
  const BufferView scores = scratch.sub(0, uint64_t{group} * per_query);
  const std::vector<uint32_t> spec = {sg, shape.head_dim, g, rope.n_rot, rope.neox ? 1u : 0u, k_decode_dims, softcapped(shape)};
  const uint32_t per_lane = decode_per_lane(n_kv, sg);
  const std::string ct = cache_type_name(type);
  const bool rot = rotated.rows.buffer != VK_NULL_HANDLE;
  VKLLM_CHECK(!rot || (type == CacheType::F16 && rotated.split <= n_kv), "attention: a rotated copy of K needs an f16 cache");
  const Pipeline& ps = rot ? rec.pipelines().get("attention_scores_f16_rot", 10, sizeof(AttentionParams), spec)
                           : rec.pipelines().get("attention_scores_" + ct, 9, sizeof(AttentionParams), spec);
  const Pipeline& pv = rec.pipelines().get("attention_values_" + ct, 9, sizeof(AttentionParams), spec);
  // Lanes' blocks of entries: those before the split, then those after it.
  const uint32_t split = rot ? rotated.split : 0;
  const uint32_t blocks = div_ceil(split, per_lane) + div_ceil(n_kv - split, per_lane);
  // q, the rope table and the lists are read as texels (attention_decode.comp). q and the lists are
  // bound from their buffers' start to their end, one view each whatever the step, and found at
  // offsets in the push constants (bases); the rope table is bound as it is.
  check_rope_texels(rec, rope, rope_table);
  VKLLM_CHECK(q.offset % 16 == 0, "attention: q not on a texel boundary");
  for (uint32_t t = first; t < n_q; t += group) {
    const uint32_t n = std::min(group, n_q - t);
    AttentionParams params = attention_params(shape, rope, n_q, n_kv, q_stride, out_stride, 1, n_kv);
    params.q_first = t;
    params.rot_split = split;
    params.q_base = static_cast<uint32_t>(q.offset / 16);
    params.kv_slots_base = static_cast<uint32_t>(kv_slots.offset / 4);
    params.kv_pos_base = static_cast<uint32_t>(kv_pos.offset / 4);
    params.kv_rot_base = static_cast<uint32_t>(rotated.rot.offset / 4);
    params.rot_slots = rot ? copy_slots(rotated, shape.n_head_kv * shape.head_dim) : 0;
    params.per_lane = per_lane;
    if (t > first) rec.barrier();  // the previous group's values pass has read the scores
    // The values pass binds the whole scratch (a storage texel buffer; one view for every n_kv), the
    // scores pass the group's scores (a storage buffer).
    if (rot)
      rec.dispatch(ps,
                   {q.whole(), rotated.rows, v_cache, kv_slots.whole(), kv_pos.whole(), q_pos, out, scores, rope_table,
                    rotated.rot.whole()},
                   params, div_ceil(blocks, sg), shape.n_head_kv, n);
    else
      rec.dispatch(ps, {q.whole(), k_cache, v_cache, kv_slots.whole(), kv_pos.whole(), q_pos, out, scores, rope_table}, params,
                   div_ceil(blocks, sg), shape.n_head_kv, n);
    rec.barrier();
    rec.dispatch(pv, {q, k_cache, v_cache, kv_slots.whole(), kv_pos.whole(), q_pos, out, scratch, rope_table}, params,
                 shape.head_dim / k_decode_dims, shape.n_head_kv, n);
  }
}

}  // namespace

void record_rope_table(CommandRecorder& rec, const BufferView& table, uint32_t n_pos, const RopeConfig& rope) {
  const Pipeline& p = rec.pipelines().get("rope_table", 2, sizeof(RopeParams), {32});
  RopeParams params{n_pos, rope.head_dim, rope.n_rot, rope.freq_base, rope.freq_scale, rope.neox ? 1u : 0u,
                    rope.factors.buffer ? 1u : 0u, rope.attn_factor, 0, 0.0f, 0.0f, 0.0f};
  if (rope.ext_factor > 0.0f) {
    params.ext_factor = rope.ext_factor;
    // ggml's correction dims: the pair whose wavelength fits beta times into n_ctx_orig, rounded
    // outwards and clamped to the rotated dims (ggml_rope_yarn_corr_dims, in float as there).
    const auto corr_dim = [&](float beta) {
      return float(rope.n_rot) * std::log(float(rope.n_ctx_orig) / (beta * 2.0f * float(M_PI))) / (2.0f * std::log(rope.freq_base));
    };
    params.corr_lo = std::max(0.0f, std::floor(corr_dim(rope.beta_fast)));
    params.corr_hi = std::min(float(rope.n_rot) - 1.0f, std::ceil(corr_dim(rope.beta_slow)));
  }
  // A workgroup row per position, in dispatches of at most the device's grid height (65,535 on
  // many devices, fewer than a 128k context's positions).
  const uint32_t rows = rec.context().limits().maxComputeWorkGroupCount[1];
  for (uint32_t first = 0; first < n_pos; first += std::min(rows, n_pos - first)) {
    params.pos_first = first;
    rec.dispatch(p, {table, or_dummy(rope.factors, table)}, params, div_ceil(rope.head_dim / 2, 32), std::min(rows, n_pos - first));
  }
}

namespace {

void check_kv_row(CacheType type, uint32_t row_len) {
  VKLLM_CHECK(cache_type_fits(type, row_len), "KV row length not a multiple of 32 for a quantized cache");
}

const Pipeline& kv_store_pipeline(CommandRecorder& rec, CacheType type) {
  return rec.pipelines().get(std::string("kv_store_") + cache_type_name(type), 4, sizeof(KvStoreParams), {64});
}

// kv_store_f16 that also writes the rotated copy of K.
const Pipeline& kv_store_rot_pipeline(CommandRecorder& rec, const RopeConfig& r) {
  return rec.pipelines().get("kv_store_f16_rot", 7, sizeof(KvStoreParams), {64, r.head_dim, r.n_rot, r.neox ? 1u : 0u});
}

uint32_t kv_store_groups(CacheType type, uint32_t row_len) { return div_ceil(type == CacheType::F16 ? row_len : row_len / 32, 64); }

}  // namespace

void record_kv_store(CommandRecorder& rec, CacheType type, const BufferView& src, uint32_t src_stride,
                     const BufferView& slots, uint32_t n_tokens, uint32_t row_len, const BufferView& cache) {
  check_kv_row(type, row_len);
  // z = 0 alone (binding 3, unused, bound to the same cache).
  rec.dispatch(kv_store_pipeline(rec, type), {src, slots, cache, cache}, KvStoreParams{n_tokens, row_len, src_stride, 0},
               kv_store_groups(type, row_len), n_tokens);
}

void record_kv_store_pair(CommandRecorder& rec, CacheType type_k, CacheType type_v, const BufferView& k_src,
                          const BufferView& v_src, uint32_t src_stride, const BufferView& slots, uint32_t n_tokens,
                          uint32_t row_len, const BufferView& k_cache, const BufferView& v_cache, const RotatedK& rotated) {
  const bool rot = rotated.rows.buffer != VK_NULL_HANDLE;
  VKLLM_CHECK(!rot || type_k == CacheType::F16, "kv_store: a rotated copy of K needs an f16 cache");
  const bool one = type_k == type_v && k_src.buffer == v_src.buffer && v_src.offset >= k_src.offset &&
                   (v_src.offset - k_src.offset) % 4 == 0;
  if (!one && !rot) {
    record_kv_store(rec, type_k, k_src, src_stride, slots, n_tokens, row_len, k_cache);
    record_kv_store(rec, type_v, v_src, src_stride, slots, n_tokens, row_len, v_cache);
    return;
  }
  check_kv_row(type_k, row_len);
  if (!one) {  // K (with its copy) alone, then V
    rec.dispatch(kv_store_rot_pipeline(rec, rotated.rope),
                 {k_src, slots, k_cache, k_cache, rotated.rows, rotated.rot, rotated.rope_table},
                 KvStoreParams{n_tokens, row_len, src_stride, 0, copy_slots(rotated, row_len)}, kv_store_groups(type_k, row_len),
                 n_tokens);
    record_kv_store(rec, type_v, v_src, src_stride, slots, n_tokens, row_len, v_cache);
    return;
  }
  const BufferView src{k_src.buffer, k_src.offset, v_src.offset + v_src.range - k_src.offset};
  const uint32_t v_offset = static_cast<uint32_t>((v_src.offset - k_src.offset) / 4);
  const KvStoreParams params{n_tokens, row_len, src_stride, v_offset, rot ? copy_slots(rotated, row_len) : 0};
  if (rot)
    rec.dispatch(kv_store_rot_pipeline(rec, rotated.rope), {src, slots, k_cache, v_cache, rotated.rows, rotated.rot, rotated.rope_table},
                 params, kv_store_groups(type_k, row_len), n_tokens, 2);
  else
    rec.dispatch(kv_store_pipeline(rec, type_k), {src, slots, k_cache, v_cache}, params, kv_store_groups(type_k, row_len), n_tokens, 2);
}

void record_kv_rotate(CommandRecorder& rec, const BufferView& k_cache, const BufferView& slots, uint32_t n, uint32_t row_len,
                      const RotatedK& rotated) {
  const RopeConfig& r = rotated.rope;
  const Pipeline& p = rec.pipelines().get("kv_rotate", 5, sizeof(KvStoreParams), {64, r.head_dim, r.n_rot, r.neox ? 1u : 0u});
  rec.dispatch(p, {k_cache, slots, rotated.rot, rotated.rows, rotated.rope_table},
               KvStoreParams{n, row_len, 0, 0, copy_slots(rotated, row_len)}, div_ceil(row_len, 64), n);
}

bool decode_shape_fits(const AttentionShape& shape, uint32_t max_kv) {
  const uint32_t g = shape.n_head / shape.n_head_kv;
  return max_kv >= k_decode_min_kv && g <= 8 && shape.head_dim % k_decode_dims == 0 && g * shape.head_dim <= k_decode_unroll;
}

bool attention_per_query_exact(const VulkanContext& ctx, const AttentionShape& shape, uint32_t n_rot) {
  // A lone token's list past its window holds window to window + list_align − 1 entries: where
  // that range straddles k_decode_min_kv and the kernel a lone token takes changes there, a pass's
  // tokens would take one, the other, then the first again (record_attention).
  const uint32_t align = std::max<uint32_t>(shape.list_align, 1);
  if (shape.window == 0 || shape.window >= k_decode_min_kv || shape.window + align - 1 < k_decode_min_kv) return true;
  const auto kind = [&](uint32_t n_kv) {
    return decode_kernels_fit(ctx, shape, n_kv) ? AttentionKernel::Auto : attention_kernel_for(ctx, shape, n_rot, n_kv);
  };
  return kind(k_decode_min_kv - 1) == kind(k_decode_min_kv);
}

uint32_t window_list_first(uint32_t pos, uint32_t window, uint32_t align) {
  if (window == 0 || pos < window) return 0;
  align = std::max<uint32_t>(align, 1);
  return (pos - window + 1) / align * align;
}

bool rotated_copy_table_fits(uint32_t capacity, uint32_t max_grid_height) { return uint64_t{2} * capacity <= max_grid_height; }

bool decode_kernels_fit(const VulkanContext& ctx, const AttentionShape& shape, uint32_t max_kv) {
  const DeviceInfo& d = ctx.info();
  const bool cpu_layout = shape.kernel == AttentionKernel::Simd || (shape.kernel == AttentionKernel::Auto && d.type == "cpu");
  // (The scores pass writes a query's scores through one storage-buffer binding.)
  return cpu_layout && d.int64 && decode_shape_fits(shape, max_kv) && decode_scores_floats(shape, max_kv) * 4 <= ctx.max_storage_range();
}

uint32_t attention_alone_group(const VulkanContext& ctx) { return ctx.info().type == "cpu" ? 1 : k_alone_group; }

uint32_t attention_query_group(const VulkanContext& ctx, const AttentionShape& shape, uint32_t max_kv) {
  if (ctx.info().type != "cpu") return 1;
  const uint64_t per_query = decode_scores_floats(shape, std::max<uint32_t>(max_kv, 1)) * 4;
  return static_cast<uint32_t>(std::clamp<uint64_t>(k_decode_group_bytes / per_query, 1, k_decode_max_group));
}

uint64_t attention_scratch_floats(const AttentionShape& shape, uint32_t max_kv, uint32_t queries, uint32_t alone) {
  // [split][n_head_kv][rows = G][head_dim] outputs plus (max, sum) per row, for `alone` query
  // tokens; or attention_decode.comp's scores for `queries` query tokens.
  return std::max(uint64_t{alone} * k_max_split * shape.n_head * (shape.head_dim + 2), uint64_t{queries} * decode_scores_floats(shape, max_kv));
}

namespace {

// The tiled or simd kernel's pipeline and tile for `rows` query rows of one workgroup's tokens.
struct ListPipeline {
  const Pipeline* pipeline;
  AttentionTiles tiles;
};
ListPipeline list_pipeline(CommandRecorder& rec, CacheType type, const AttentionShape& shape, const RopeConfig& rope, bool simd,
                           uint32_t rows) {
  const AttentionTiles t = simd ? AttentionTiles{rec.context().subgroup_size(), simd_rows(shape.head_dim, rows), 0}
                                : attention_tiles(rec.context(), shape.head_dim, rows);
  const Pipeline& p =
      simd ? rec.pipelines().get(std::string("attention_simd_") + cache_type_name(type), 10, sizeof(AttentionParams),
                                 {t.wg, shape.head_dim, t.bq, rope.n_rot, rope.neox ? 1u : 0u, softcapped(shape)})
           : rec.pipelines().get(std::string("attention_") + cache_type_name(type), 10, sizeof(AttentionParams),
                                 {t.wg, shape.head_dim, t.bq, t.bkv});
  return {&p, t};
}

// The splits a token's list may take in `scratch` for `rows` query rows of one tile (1 where the
// rows take several tiles or there is no scratch).
uint32_t split_cap(const AttentionShape& shape, uint32_t rows, uint32_t row_tiles, const BufferView& scratch) {
  if (row_tiles != 1 || !scratch.buffer) return 1;
  const uint64_t per_split = uint64_t{shape.n_head_kv} * rows * (shape.head_dim + 2) * 4;
  return static_cast<uint32_t>(std::max<uint64_t>(std::min<uint64_t>(scratch.range / per_split, k_max_split), 1));
}

// Splits of a list of n entries (at least ATTENTION_SPLIT_MIN_KV each, at most cap) and the
// entries of each: alone_splits in common/attention_alone.glsl.
void list_splits(uint32_t n, uint32_t cap, uint32_t& n_split, uint32_t& per_split) {
  n_split = std::clamp<uint32_t>(n / ATTENTION_SPLIT_MIN_KV, 1, std::max<uint32_t>(cap, 1));
  per_split = std::max<uint32_t>(div_ceil(std::max<uint32_t>(n, 1), n_split), 1);
  n_split = std::max<uint32_t>(div_ceil(std::max<uint32_t>(n, 1), per_split), 1);
}

// The entries of the list a pass's query token i reads when it runs alone: window_list_begin in
// common/window_list.glsl, for a logical list (entry e at position list_pos0 + e).
uint32_t alone_list_length(const AttentionShape& shape, uint32_t n_q, uint32_t n_kv, uint32_t i) {
  const uint32_t end = n_kv - n_q + i + 1;
  const uint32_t first = window_list_first(shape.list_pos0 + end - 1, shape.window, shape.list_align);
  return first > shape.list_pos0 ? end - (first - shape.list_pos0) : end;
}

// The tiled or simd kernel for the query tokens [first, n_q) of a pass, each over the list it
// reads alone and split as it is alone (common/attention_alone.glsl), in groups of as many tokens
// as the scratch holds the partials of; attention_combine.comp merges the split ones.
void record_alone_attention(CommandRecorder& rec, CacheType type, const AttentionShape& shape, const RopeConfig& rope,
                            const BufferView& rope_table, const BufferView& q, uint32_t q_stride, const BufferView& q_pos,
                            uint32_t n_q, uint32_t first, const BufferView& k_cache, const BufferView& v_cache,
                            const BufferView& kv_slots, const BufferView& kv_pos, uint32_t n_kv, const BufferView& out,
                            uint32_t out_stride, const BufferView& scratch, bool simd) {
  const uint32_t g = shape.n_head / shape.n_head_kv;
  const ListPipeline lp = list_pipeline(rec, type, shape, rope, simd, g);
  const uint32_t row_tiles = div_ceil(g, lp.tiles.bq);
  const uint32_t cap = split_cap(shape, g, row_tiles, scratch);
  // The grid's splits per token: the most a token's list may take before list_splits evens them
  // (the shader caps its tokens' at these, which changes none of them).
  uint32_t n_split = 1;
  for (uint32_t i = first; i < n_q; ++i)
    n_split = std::max(n_split, std::clamp<uint32_t>(alone_list_length(shape, n_q, n_kv, i) / ATTENTION_SPLIT_MIN_KV, 1, cap));
  const uint64_t o_per_token = uint64_t{n_split} * shape.n_head_kv * g * shape.head_dim * 4;
  const uint64_t ml_per_token = uint64_t{n_split} * shape.n_head_kv * g * 2 * 4;
  const uint64_t align = std::max<uint64_t>(rec.context().limits().minStorageBufferOffsetAlignment, 4);
  uint32_t group = n_q - first;
  if (n_split > 1) {
    const auto fits = [&](uint64_t n) { return (n * o_per_token + align - 1) / align * align + n * ml_per_token <= scratch.range; };
    VKLLM_CHECK(fits(1), "attention scratch too small for a token's split-KV partials");
    while (!fits(group)) --group;
  }
  AttentionParams params = attention_params(shape, rope, n_q, n_kv, q_stride, out_stride, n_split, 0);
  params.alone = 1;
  params.split_cap = cap;
  const uint64_t ml_at = (group * o_per_token + align - 1) / align * align;
  const BufferView partial_o = n_split > 1 ? scratch.sub(0, group * o_per_token) : out;
  const BufferView partial_ml = n_split > 1 ? scratch.sub(ml_at, group * ml_per_token) : out;
  for (uint32_t t = first; t < n_q; t += group) {
    const uint32_t n = std::min(group, n_q - t);
    params.q_first = t;
    if (t > first) rec.barrier();  // the previous group's combine has read the partials
    rec.dispatch(*lp.pipeline, {q, k_cache, v_cache, kv_slots, kv_pos, q_pos, partial_o, partial_ml, rope_table, out}, params,
                 row_tiles, shape.n_head_kv, n * n_split);
    if (n_split == 1) continue;
    rec.barrier();
    const Pipeline& c = rec.pipelines().get("attention_combine", 5, sizeof(AttentionParams), {64});
    AttentionParams cp = params;
    cp.n_q = t + n;  // the group's tokens are its last ones: each token's list end as in the pass
    cp.n_kv = n_kv - (n_q - cp.n_q);
    rec.dispatch(c, {partial_o, partial_ml, out, q_pos, kv_pos}, cp, div_ceil(shape.head_dim, 64), n * g, shape.n_head_kv);
  }
}

// The kernels that walk the slot list for each query (attention_lanes, attention_simd, the tiled
// one), as attention_kernel_for picks them; one token, or a per_query pass's tokens from `first`
// on, alone.
void record_list_attention(CommandRecorder& rec, CacheType type, const AttentionShape& shape, const RopeConfig& rope,
                           const BufferView& rope_table, const BufferView& q, uint32_t q_stride, const BufferView& q_pos, uint32_t n_q,
                           const BufferView& k_cache, const BufferView& v_cache, const BufferView& kv_slots,
                           const BufferView& kv_pos, uint32_t n_kv, const BufferView& out, uint32_t out_stride,
                           const BufferView& scratch, uint32_t first = 0) {
  const uint32_t g = shape.n_head / shape.n_head_kv;
  const uint32_t rows = n_q * g;
  const AttentionKernel kernel = attention_kernel_for(rec.context(), shape, rope.n_rot, n_kv);
  if (kernel == AttentionKernel::Lanes) {
    const uint32_t sg = rec.context().subgroup_size();
    AttentionParams params = attention_params(shape, rope, n_q, n_kv, q_stride, out_stride, 1, n_kv);
    // The slot list and positions as texels of their whole buffers (one view each whatever the
    // step), found at bases; the rope table as texels of two (cos, sin) pairs.
    check_rope_texels(rec, rope, rope_table);
    params.kv_slots_base = static_cast<uint32_t>(kv_slots.offset / 4);
    params.kv_pos_base = static_cast<uint32_t>(kv_pos.offset / 4);
    const Pipeline& p = rec.pipelines().get(std::string("attention_lanes_") + cache_type_name(type), 9, sizeof(AttentionParams),
                                            {sg, shape.head_dim, rope.n_rot, rope.neox ? 1u : 0u, softcapped(shape)});
    rec.dispatch(p, {q, k_cache, v_cache, kv_slots.whole(), kv_pos.whole(), q_pos, out, out, rope_table}, params,
                 div_ceil(n_q * shape.n_head, sg));
    return;
  }
  const bool simd = kernel == AttentionKernel::Simd;
  if (n_q == 1 || shape.per_query) {
    record_alone_attention(rec, type, shape, rope, rope_table, q, q_stride, q_pos, n_q, first, k_cache, v_cache, kv_slots, kv_pos,
                           n_kv, out, out_stride, scratch, simd);
    return;
  }
  const ListPipeline lp = list_pipeline(rec, type, shape, rope, simd, rows);
  const uint32_t row_tiles = div_ceil(rows, lp.tiles.bq);
  // Split the slot list when one tile of queries per KV head would leave the device idle (a few
  // query tokens over a long cached prefix: a prefill after a prompt-cache or session restore, a
  // short last chunk), as far as their partials fit the scratch.
  uint32_t n_split = 1, kv_per_split = 0;
  list_splits(n_kv, split_cap(shape, rows, row_tiles, scratch), n_split, kv_per_split);
  const AttentionParams params = attention_params(shape, rope, n_q, n_kv, q_stride, out_stride, n_split, kv_per_split);
  if (n_split == 1) {
    rec.dispatch(*lp.pipeline, {q, k_cache, v_cache, kv_slots, kv_pos, q_pos, out, out, rope_table, out}, params, row_tiles,
                 shape.n_head_kv, 1);
    return;
  }
  const uint64_t o_floats = uint64_t{n_split} * shape.n_head_kv * rows * shape.head_dim;
  const BufferView partial_o = scratch.sub(0, o_floats * 4);
  const BufferView partial_ml = scratch.sub(o_floats * 4, uint64_t{n_split} * shape.n_head_kv * rows * 2 * 4);
  VKLLM_CHECK(o_floats * 4 + partial_ml.range <= scratch.range, "attention scratch too small");
  rec.dispatch(*lp.pipeline, {q, k_cache, v_cache, kv_slots, kv_pos, q_pos, partial_o, partial_ml, rope_table, out}, params,
               row_tiles, shape.n_head_kv, n_split);
  rec.barrier();
  const Pipeline& c = rec.pipelines().get("attention_combine", 5, sizeof(AttentionParams), {64});
  rec.dispatch(c, {partial_o, partial_ml, out, q_pos, kv_pos}, params, div_ceil(shape.head_dim, 64), rows, shape.n_head_kv);
}

// What a pass's query token takes alone: the decode kernels, the lanes kernel or another list kernel.
enum class AloneWay { Decode, Lanes, List };

AloneWay alone_way(const VulkanContext& ctx, const AttentionShape& shape, uint32_t n_rot, uint32_t n_kv, const BufferView& scratch) {
  if (use_decode_kernels(ctx, shape, 1, n_kv, scratch)) return AloneWay::Decode;
  return attention_kernel_for(ctx, shape, n_rot, n_kv) == AttentionKernel::Lanes ? AloneWay::Lanes : AloneWay::List;
}

}  // namespace

void record_attention(CommandRecorder& rec, CacheType type, const AttentionShape& shape, const RopeConfig& rope,
                      const BufferView& rope_table, const BufferView& q, uint32_t q_stride, const BufferView& q_pos, uint32_t n_q,
                      const BufferView& k_cache, const BufferView& v_cache, const BufferView& kv_slots,
                      const BufferView& kv_pos, uint32_t n_kv, const BufferView& out, uint32_t out_stride,
                      const BufferView& scratch, const RotatedK& rotated) {
  VKLLM_CHECK(shape.n_head % shape.n_head_kv == 0 && shape.head_dim % 2 == 0, "bad attention shape");
  VKLLM_CHECK(!shape.per_query || n_kv >= n_q, "attention: a per_query pass's list must hold its own tokens");
  const VulkanContext& ctx = rec.context();
  // Each query takes the kernel it would take alone, a decode step over the slots it sees (the
  // chunk's own tokens are the list's last n_q entries: query i sees the first n_kv − n_q + i + 1),
  // so that a token's attention, and the text after it, does not depend on how its prompt was cut
  // into chunks, where the decode kernels take the longer lists (CPU drivers), and in a per_query
  // pass everywhere. Leading queries that see fewer slots take the lanes kernel (CPU drivers: it
  // gives a query the same floats whatever the list holds past what it sees); in a per_query pass
  // the others take the list kernels alone.
  const auto way = [&](uint32_t i) {
    const uint32_t seen = shape.per_query ? alone_list_length(shape, n_q, n_kv, i) : n_kv - n_q + i + 1;
    return alone_way(ctx, shape, rope.n_rot, seen, scratch);
  };
  if (!shape.per_query && !use_decode_kernels(ctx, shape, n_q, n_kv, scratch)) {
    record_list_attention(rec, type, shape, rope, rope_table, q, q_stride, q_pos, n_q, k_cache, v_cache, kv_slots, kv_pos, n_kv,
                          out, out_stride, scratch);
    return;
  }
  uint32_t first = 0;  // the leading queries that do not take the decode kernels
  if (n_kv >= n_q)
    while (first < n_q && way(first) != AloneWay::Decode) ++first;
  // Of those, the ones a list call over the first ones' entries serves as one: all of them in a
  // prefill chunk; in a per_query pass those that take the lanes kernel alone (the rest take the
  // other list kernels alone).
  uint32_t shared = first;
  if (shape.per_query) {
    shared = 0;
    while (shared < first && way(shared) == AloneWay::Lanes) ++shared;
    for (uint32_t i = shared; i < n_q; ++i)
      VKLLM_CHECK(way(i) == (i < first ? AloneWay::List : AloneWay::Decode),
                  "attention: a pass whose tokens alone take one kernel, then another, then the first again "
                  "(attention_per_query_exact)");
  }
  if (shared > 0) {
    // (A per_query pass's lanes tokens take it over the longer list too: past a token's own
    // entry, or behind its window, an entry adds exact zeros.)
    AttentionShape lanes = shape;
    if (shape.per_query) lanes.kernel = AttentionKernel::Lanes;
    record_list_attention(rec, type, lanes, rope, rope_table, q, q_stride, q_pos, shared, k_cache, v_cache, kv_slots, kv_pos,
                          n_kv - n_q + shared, out, out_stride, scratch);
  }
  if (first > shared)  // tokens [shared, first), their lists ending as in the pass
    record_list_attention(rec, type, shape, rope, rope_table, q, q_stride, q_pos, first, k_cache, v_cache, kv_slots, kv_pos,
                          n_kv - n_q + first, out, out_stride, scratch, shared);
  if (first == n_q) return;
  if (first > 0) rec.barrier();  // the decode kernels' scores overwrite the scratch the list kernels may have used
  record_decode_attention(rec, type, shape, rope, rope_table, q, q_stride, q_pos, n_q, k_cache, v_cache, kv_slots, kv_pos, n_kv,
                          out, out_stride, scratch, rotated, first);
}

bool batch_attention_fits(const VulkanContext& ctx, CacheType type_k, CacheType type_v, const AttentionShape& shape,
                          const RopeConfig& rope, uint32_t max_n_kv) {
  // attention_lanes_f16_batch pushes 24 descriptors (9 bindings, 5 of them arrays of k_batch_seqs):
  // 17 texel buffers (the caches, the lists, the rope table) and 7 storage buffers;
  // kv_store_f16_rot_batch 22 storage buffers.
  const DeviceInfo& d = ctx.info();
  const VkPhysicalDeviceLimits& l = ctx.limits();
  return d.binding_arrays && d.max_push_descriptors >= 4 + 5 * k_batch_seqs &&
         l.maxPerStageDescriptorStorageBuffers >= 2 + 5 * k_batch_seqs && l.maxPerStageDescriptorStorageImages >= 1 + 4 * k_batch_seqs &&
         l.maxPerStageResources >= 4 + 5 * k_batch_seqs && type_k == CacheType::F16 &&
         type_v == CacheType::F16 && shape.kernel != AttentionKernel::Simd && shape.kernel != AttentionKernel::Tiled &&
         attention_kernel_for(ctx, shape, rope.n_rot, max_n_kv) == AttentionKernel::Lanes;
}

namespace {

// The views of the sequences' field `f` for an array binding of k_batch_seqs: the missing ones
// repeat the first (bound, never read: the grid covers only the sequences there are).
template <typename F>
void add_views(std::vector<BufferView>& views, std::span<const SeqAttention> seqs, F f) {
  for (uint32_t i = 0; i < k_batch_seqs; ++i) views.push_back(f(seqs[i < seqs.size() ? i : 0]));
}

}  // namespace

void record_batch_kv_store(CommandRecorder& rec, const BufferView& k_src, const BufferView& v_src, uint32_t src_stride,
                           uint32_t row_len, std::span<const SeqAttention> seqs) {
  VKLLM_CHECK(!seqs.empty() && seqs.size() <= k_batch_seqs, "batched kv_store: 1 to 4 sequences");
  VKLLM_CHECK(k_src.buffer == v_src.buffer && v_src.offset >= k_src.offset && (v_src.offset - k_src.offset) % 4 == 0,
              "batched kv_store: V rows must follow the K rows in one buffer");
  const RotatedK& r0 = seqs[0].rotated;
  const bool rot = r0.rows.buffer != VK_NULL_HANDLE;
  for (const SeqAttention& s : seqs)
    VKLLM_CHECK((s.rotated.rows.buffer != VK_NULL_HANDLE) == rot && (!rot || copy_slots(s.rotated, row_len) == copy_slots(r0, row_len)),
                "batched kv_store: every sequence has a rotated copy of K of one size, or none does");
  const BufferView src{k_src.buffer, k_src.offset, v_src.offset + v_src.range - k_src.offset};
  const KvStoreParams params{1, row_len, src_stride, static_cast<uint32_t>((v_src.offset - k_src.offset) / 4),
                             rot ? copy_slots(r0, row_len) : 0};
  std::vector<BufferView> views{src};
  add_views(views, seqs, [](const SeqAttention& s) { return s.slots; });
  add_views(views, seqs, [](const SeqAttention& s) { return s.k_cache; });
  add_views(views, seqs, [](const SeqAttention& s) { return s.v_cache; });
  const uint32_t n = static_cast<uint32_t>(seqs.size());
  if (!rot) {
    const Pipeline& p = rec.pipelines().get("kv_store_f16_batch", 4, sizeof(KvStoreParams), {64});
    rec.dispatch_views(p, views, params, kv_store_groups(CacheType::F16, row_len), n, 2);
    return;
  }
  add_views(views, seqs, [](const SeqAttention& s) { return s.rotated.rows; });
  add_views(views, seqs, [](const SeqAttention& s) { return s.rotated.rot; });
  views.push_back(r0.rope_table);
  const RopeConfig& r = r0.rope;
  const Pipeline& p = rec.pipelines().get("kv_store_f16_rot_batch", 7, sizeof(KvStoreParams), {64, r.head_dim, r.n_rot, r.neox ? 1u : 0u});
  rec.dispatch_views(p, views, params, kv_store_groups(CacheType::F16, row_len), n, 2);
}

void record_batch_attention(CommandRecorder& rec, const AttentionShape& shape, const RopeConfig& rope, const BufferView& rope_table,
                            const BufferView& q, uint32_t q_stride, const BufferView& out, uint32_t out_stride,
                            std::span<const SeqAttention> seqs) {
  VKLLM_CHECK(!seqs.empty() && seqs.size() <= k_batch_seqs, "batched attention: 1 to 4 sequences");
  VKLLM_CHECK(shape.n_head % shape.n_head_kv == 0, "bad attention shape");
  struct {
    AttentionParams a;
    uint32_t n_kv[k_batch_seqs];
  } params{attention_params(shape, rope, 1, 0, q_stride, out_stride, 1, 0), {}};
  static_assert(sizeof(params) <= 128, "push constants past the 128 bytes every Vulkan device has");
  for (size_t i = 0; i < seqs.size(); ++i) params.n_kv[i] = seqs[i].n_kv;
  std::vector<BufferView> views{q};
  add_views(views, seqs, [](const SeqAttention& s) { return s.k_cache; });
  add_views(views, seqs, [](const SeqAttention& s) { return s.v_cache; });
  // The lists as texels of their whole buffers (one view each whatever the step), from entry 0.
  for (const SeqAttention& s : seqs)
    VKLLM_CHECK(s.kv_slots.offset == 0 && s.kv_pos.offset == 0, "batched attention: a slot list not at its buffer's start");
  add_views(views, seqs, [](const SeqAttention& s) { return s.kv_slots.whole(); });
  add_views(views, seqs, [](const SeqAttention& s) { return s.kv_pos.whole(); });
  add_views(views, seqs, [](const SeqAttention& s) { return s.q_pos; });
  views.insert(views.end(), {out, out, rope_table});
  const uint32_t sg = rec.context().subgroup_size();
  check_rope_texels(rec, rope, rope_table);
  const Pipeline& p = rec.pipelines().get("attention_lanes_f16_batch", 9, sizeof(params),
                                          {sg, shape.head_dim, rope.n_rot, rope.neox ? 1u : 0u, softcapped(shape)});
  rec.dispatch_views(p, views, params, div_ceil(shape.n_head, sg), static_cast<uint32_t>(seqs.size()));
}

}  // namespace vkllm
