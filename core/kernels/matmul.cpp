// Recording of the weight-reading kernels: get_rows, matvec and matmul, per weight part.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "base/ascii.h"
#include "kernels/params.h"
#include "kernels/ops.h"

namespace vkllm {

bool weight_type_supported(gguf::TensorType t) {
  using T = gguf::TensorType;
  switch (t) {
    case T::F32: case T::F16: case T::BF16: case T::Q4_0: case T::Q4_1: case T::Q5_0: case T::Q5_1: case T::Q8_0:
    case T::Q2_K: case T::Q3_K: case T::Q4_K: case T::Q5_K: case T::Q6_K: case T::IQ4_NL: case T::IQ4_XS:
      return true;
    default:
      return false;
  }
}

namespace {
std::string type_suffix(gguf::TensorType t) { return ascii_lower(gguf::type_name(t)); }
}  // namespace

std::string weight_kernel_suffix(const DeviceTensor& w) {
  if (!weight_type_supported(w.type))
    throw Error("tensor '" + w.name + "' has type " + gguf::type_name(w.type) + ", which vkllm cannot run yet");
  return type_suffix(w.type);
}

void record_get_rows(CommandRecorder& rec, const DeviceTensor& w, const BufferView& ids, uint32_t n_tokens,
                     const BufferView& out, uint32_t out_stride) {
  const Pipeline& p = rec.pipelines().get("get_rows_" + weight_kernel_suffix(w), 3, sizeof(GetRowsParams), {64});
  for (const WeightPart& part : w.parts) {
    const GetRowsParams params{n_tokens, uint32_t(w.cols), uint32_t(w.row_bytes), part.row_begin, part.n_rows, out_stride};
    rec.dispatch(p, {part.view, ids, out}, params, div_ceil(div_ceil(w.cols, 8), 64), n_tokens);
  }
}

MatvecTuning parse_matvec_tuning(std::string_view text, MatvecTuning t) {
  const std::string whole(text);
  const auto bad = [&](std::string_view part, const char* why) {
    return Error("VKLLM_MATVEC=\"" + whole + "\": '" + std::string(part) + "' " + why);
  };
  const auto pow2 = [](uint32_t v) { return v != 0 && (v & (v - 1)) == 0; };
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view part = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos) throw bad(part, "is not name=value");
    const std::string_view name = part.substr(0, eq), value = part.substr(eq + 1);
    uint32_t v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc{} || end != value.data() + value.size()) throw bad(part, "has no whole number");
    if (name == "wg") {
      if (!pow2(v) || v < 32 || v > 1024) throw bad(part, "must be a power of two from 32 to 1024");
      t.wg = v;
    } else if (name == "in_flight") {
      if (v != 1 && v != 2 && v != 4 && v != 8) throw bad(part, "must be 1, 2, 4 or 8");
      t.in_flight = v;
    } else if (name == "rps") {
      if (v < 1 || v > 4) throw bad(part, "must be 1 to 4");
      t.rps = v;
    } else if (name == "split") {
      if (!pow2(v) || v > 32) throw bad(part, "must be a power of two up to 32");
      t.split = v;
    } else if (name == "q8x") {
      if (v > 1) throw bad(part, "must be 0 or 1");
      t.q8x = v;
    } else if (name == "cols") {
      if (v != 1 && v != 2 && v != 4 && v != 8) throw bad(part, "must be 1, 2, 4 or 8");
      t.cols = v;
    } else {
      throw bad(part, "names none of wg, in_flight, rps, split, q8x, cols");
    }
  }
  return t;
}

namespace {

std::mutex g_tuning_mutex;
std::optional<MatvecTuning> g_tuning;  // set_matvec_tuning's

// The GPU tuning: set_matvec_tuning's, else VKLLM_MATVEC's (read once), else the default.
MatvecTuning gpu_tuning() {
  static const MatvecTuning from_env = [] {
    const char* v = std::getenv("VKLLM_MATVEC");
    return v && *v ? parse_matvec_tuning(v) : MatvecTuning{};
  }();
  std::lock_guard lock(g_tuning_mutex);
  return g_tuning.value_or(from_env);
}

// matvec.comp's SG_MIN: a quarter of the reported subgroup size, the narrowest a driver may run.
uint32_t matvec_sg_min(const VulkanContext& ctx) { return std::max<uint32_t>(ctx.subgroup_size() / 4, 1); }

}  // namespace

MatvecTuning matvec_tuning(const VulkanContext& ctx, MatmulKernel kernel) {
  // (A CPU driver's kernels take no tuning, but a malformed VKLLM_MATVEC is refused there too.)
  MatvecTuning t = gpu_tuning();
  if (ctx.info().type == "cpu" && kernel != MatmulKernel::PortableGpu) return {64, 1, 1, 1, 0, 1};
  // At least one whole subgroup (whose lanes the kernel strides by), at most the device's workgroup.
  t.wg = std::min(std::max(t.wg, ctx.subgroup_size()), ctx.info().max_workgroup_invocations);
  // Row groups of several subgroups sum in shared memory: 2 · rps · cols floats per subgroup.
  const uint64_t shared = t.split > 1 ? uint64_t{8} * t.rps * t.cols * (t.wg / matvec_sg_min(ctx)) : 0;
  if (shared > ctx.info().max_shared_memory)
    throw Error("VKLLM_MATVEC: wg=" + std::to_string(t.wg) + ", rps=" + std::to_string(t.rps) + ", split=" +
                std::to_string(t.split) + " and cols=" + std::to_string(t.cols) + " need " + std::to_string(shared) +
                " bytes of shared memory; " + ctx.info().name + " has " + std::to_string(ctx.info().max_shared_memory));
  return t;
}

void set_matvec_tuning(std::optional<MatvecTuning> t) {
  std::lock_guard lock(g_tuning_mutex);
  g_tuning = t;
}

namespace {

// matvec_simd.comp (CPU drivers): its weight types, each row's alignment, and the largest x slice a
// lane keeps in registers (UPL units of 256 elements). It serves any number of tokens, one
// dispatch per k_simd_cols of them: on lavapipe reading the weights once per group this way is
// far faster than the tiled matmul (docs/performance.md).
constexpr uint32_t k_simd_unit = 256, k_simd_max_upl = 8;
// Rows per workgroup: each workgroup first loads its x slices (per-lane loads, the costliest kind on
// lavapipe, COLS times over), so the more rows share them the better. lavapipe hands each of its
// threads (one per CPU) a fixed share of a dispatch's workgroups, num_workgroups / threads
// consecutive ones in one grab (Mesa's lp_cs_tpool.c), so more workgroups than threads do not
// balance the threads' work: they only repeat the x prologue. Several columns (the server's steps,
// prefill chunks) take one workgroup per CPU: measured ≈ 3.5% less 4-column matvec time on one
// thread, and more four-stream tok/s on two in every alternated pair (docs/performance.md, "One
// workgroup per CPU for several columns"). One column keeps 4 per CPU, where one per CPU measured
// no faster. A multiple of 32 rows, at least 32.
uint32_t simd_rows_per_group(uint32_t rows, uint32_t cols) {
  static const uint32_t cpus = std::max(1u, std::thread::hardware_concurrency());  // read once: recorded per matmul
  const uint32_t per_cpu = cols > 1 ? 1 : 4;
  return std::max<uint32_t>(div_ceil(rows, per_cpu * cpus * 32) * 32, 32);
}
// Columns one matvec_simd dispatch multiplies (each weight unit loaded once for all of them).
constexpr uint32_t k_simd_cols = 4;

// Where each row of `t` must start for matvec_simd: 16 bytes for units read as 64-bit words, 4 for
// the 84-, 110- and 210-byte K-quant super-blocks read as u32 words.
uint32_t simd_row_alignment(gguf::TensorType t) {
  using T = gguf::TensorType;
  return t == T::Q2_K || t == T::Q3_K || t == T::Q6_K || t == T::IQ4_XS ? 4 : 16;
}

// Whether a weight of `type` with rows of `cols` elements (`row_bytes`) runs on matvec_simd (CPU
// devices only; any number of tokens), where its parts and x are 16-byte aligned.
bool simd_matvec_fits(const VulkanContext& ctx, gguf::TensorType type, uint64_t cols, uint64_t row_bytes) {
  const uint32_t s = ctx.subgroup_size();
  return ctx.info().type == "cpu" && cols % k_simd_unit == 0 && row_bytes % simd_row_alignment(type) == 0 && s > 0 &&
         div_ceil(cols / k_simd_unit, s) <= k_simd_max_upl;
}

// Whether this part of `w` runs on matvec_simd.
bool use_simd_matvec(const VulkanContext& ctx, const DeviceTensor& w, const WeightPart& part, const BufferView& x,
                     uint32_t x_stride) {
  return simd_matvec_fits(ctx, w.type, w.cols, w.row_bytes) && part.view.offset % 16 == 0 && x.offset % 16 == 0 &&
         x_stride % 4 == 0;
}

// The matvec_simd pipeline for a group of `cols` columns (1, or up to k_simd_cols) of a weight of
// `type` with rows of `k` elements. Two variants only (lavapipe compiles each for seconds): a lone
// column, or k_simd_cols with the columns past the tokens left dead. Q4_0's columns go four per
// 64-bit multiply where that is one instruction (the same integers as two per 32-bit multiply, so a
// column's result does not depend on its batch).
bool simd_x64(const VulkanContext& ctx, gguf::TensorType type, uint32_t cols) {
  return cols > 1 && type == gguf::TensorType::Q4_0 && ctx.info().wide_int64;
}
PipelineSpec simd_matvec_spec(const VulkanContext& ctx, gguf::TensorType type, uint64_t k, uint32_t cols) {
  const uint32_t sg = ctx.subgroup_size();
  const uint32_t upl = div_ceil(uint32_t(k) / k_simd_unit, sg);
  return {"matvec_simd_" + type_suffix(type) + (simd_x64(ctx, type, cols) ? "_x64" : ""), 3, sizeof(MatmulParams),
          {sg, upl, cols == 1 ? 1u : k_simd_cols}};
}

}  // namespace

namespace {

// Where the rows of one record go (MatmulParams' segments) and whether a gate|up pair is combined.
struct MatmulLayout {
  uint32_t y_stride = 0;
  uint32_t seg_row = UINT32_MAX, seg_len = 1, seg_base = 0, seg_size = 0, seg_stride = 0;
  uint32_t glu = 0;  // 0, or a Glu
};

// The weight types matvec reads 8-bit x for (MatvecTuning::q8x; shaders/variants.cmake's matvec_q8x_*).
bool q8x_type(gguf::TensorType t) {
  using T = gguf::TensorType;
  return t == T::Q4_0 || t == T::Q4_1 || t == T::Q8_0 || t == T::Q4_K || t == T::Q5_K || t == T::Q6_K;
}

// The kernel that serves a part: matvec_simd, matvec (the two that can apply a glu), or the tiled matmul.
enum class WeightKernel { Simd, Matvec, Tiled };

WeightKernel weight_kernel_for(const VulkanContext& ctx, const DeviceTensor& w, const WeightPart& part, const BufferView& x,
                               uint32_t x_stride, uint32_t n_tokens, MatmulKernel kernel) {
  const bool portable = kernel == MatmulKernel::Portable || kernel == MatmulKernel::PortableGpu;
  if (!portable && use_simd_matvec(ctx, w, part, x, x_stride)) return WeightKernel::Simd;
  if (n_tokens == 1 || kernel == MatmulKernel::Columns) return WeightKernel::Matvec;
  // A short chunk: matvec reads each piece once for cols columns, where the tiled matmul would fill
  // few of its 64-token tiles' columns and few of a GPU's cores.
  return n_tokens <= k_matvec_chunk && matvec_tuning(ctx, kernel).cols > 1 ? WeightKernel::Matvec : WeightKernel::Tiled;
}

void record_matmul_layout(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                          uint32_t n_tokens, const BufferView& y, const MatmulLayout& out, MatmulStore store,
                          MatmulKernel kernel) {
  const std::string suffix = weight_kernel_suffix(w);
  const uint32_t max_groups = rec.context().limits().maxComputeWorkGroupCount[0];
  const uint32_t glu = out.glu;
  BufferView xq{};  // x as 8-bit blocks (MatvecTuning::q8x), made for the first part that reads it
  const uint32_t xq_stride = uint32_t(w.cols) / 4 + uint32_t(w.cols) / 32;  // words per column
  for (const WeightPart& part : w.parts) {
    const WeightKernel which = weight_kernel_for(rec.context(), w, part, x, x_stride, n_tokens, kernel);
    const uint32_t rows = glu ? part.n_rows / 2 : part.n_rows;  // output rows
    const MatmulParams params{uint32_t(w.cols), rows,         uint32_t(w.row_bytes), n_tokens,      x_stride,
                              out.y_stride,     part.row_begin, 0,                   store == MatmulStore::Accumulate,
                              out.seg_row,      out.seg_len,  out.seg_base,          out.seg_size,  out.seg_stride,
                              glu};
    if (which == WeightKernel::Simd) {
      // One subgroup per workgroup, simd_rows_per_group rows each; every lane keeps its x slices. One
      // dispatch per group of up to k_simd_cols columns: x from a view at the group's first
      // column, y through col_begin. Each column's result is the same in any group.
      for (uint32_t t = 0; t < n_tokens; t += k_simd_cols) {
        const uint32_t cols = std::min(k_simd_cols, n_tokens - t);
        const uint32_t rows_per_group = simd_rows_per_group(rows, cols);
        const uint32_t groups = div_ceil(rows, rows_per_group);
        const uint32_t gx = std::min(groups, max_groups);
        const bool x64 = simd_x64(rec.context(), w.type, cols);
        const Pipeline& p = rec.pipelines().get(simd_matvec_spec(rec.context(), w.type, w.cols, cols));
        const uint64_t x_at = uint64_t{t} * x_stride * 4;
        MatmulParams group = params;
        group.n_tokens = cols;
        group.col_begin = t;
        group.rows_per_group = rows_per_group;
        // The weights as whole 16-byte texels: the arena pads every part to them.
        const BufferView texels{part.view.buffer, part.view.offset, (part.view.range + 15) / 16 * 16};
        // x64 reads x as texels of x's whole buffer from x_base (one texel view per buffer whatever
        // the group or the token count); the others from a view at the group's first column.
        group.x_base = x64 ? uint32_t((x.offset + x_at) / 16) : 0;
        const BufferView x_view = x64 ? x.whole() : x.sub(x_at, x.range - x_at);
        rec.dispatch(p, {texels, x_view, y}, group, gx, div_ceil(groups, gx));
      }
    } else if (which == WeightKernel::Matvec) {
      // A workgroup of t.wg invocations is wg / subgroup-size subgroups, in row groups of t.split
      // subgroups (at least one group), each group taking t.rps rows at a time (MatvecTuning).
      // Columns: t.cols per workgroup layer (z), a lone decode step's one column in a specialization
      // of its own; a column's arithmetic is the same in every layer and whatever the layer's other
      // columns are (batch invariance). x as vec4 where its binding and rows allow it.
      const MatvecTuning t = matvec_tuning(rec.context(), kernel);
      const uint32_t cols = n_tokens == 1 && kernel != MatmulKernel::Columns ? 1 : t.cols;
      const uint32_t subgroups = std::max<uint32_t>(t.wg / std::max<uint32_t>(rec.context().subgroup_size(), 1), 1);
      const uint32_t rows_per_wg = std::max<uint32_t>(subgroups / t.split, 1) * t.rps;
      const uint32_t x_vec4 = x.offset % 16 == 0 && x_stride % 4 == 0 ? 1 : 0;
      const bool q8 = t.q8x && q8x_type(w.type) && rec.context().info().int_dot && w.cols % 32 == 0;
      MatmulParams mp = params;
      if (q8) {
        if (xq.buffer == VK_NULL_HANDLE) {
          xq = rec.scratch(uint64_t{n_tokens} * xq_stride * 4);
          const QuantizeXParams qp{uint32_t(w.cols), n_tokens, x_stride, xq_stride};
          rec.dispatch(rec.pipelines().get("quantize_x", 2, sizeof(QuantizeXParams), {64}), {x, xq}, qp,
                       div_ceil(w.cols / 32, 64), n_tokens);
          rec.barrier();
        }
        mp.x_stride = xq_stride;
      }
      const Pipeline& p = rec.pipelines().get((q8 ? "matvec_q8x_" : "matvec_") + suffix, 3, sizeof(MatmulParams),
                                              {t.wg, rows_per_wg, x_vec4, t.in_flight, t.rps, t.split, cols,
                                               matvec_sg_min(rec.context())});
      const uint32_t groups = div_ceil(rows, rows_per_wg);
      const uint32_t gx = std::min(groups, max_groups);  // folded into y past the x limit
      rec.dispatch(p, {part.view, q8 ? xq : x, y}, mp, gx, div_ceil(groups, gx), div_ceil(n_tokens, cols));
    } else {
      VKLLM_CHECK(!glu, "the tiled matmul has no gated activation");
      const Pipeline& p = rec.pipelines().get("matmul_" + suffix, 3, sizeof(MatmulParams), {256});
      rec.dispatch(p, {part.view, x, y}, params, div_ceil(rows, 64), div_ceil(n_tokens, 64));
    }
  }
}

}  // namespace

std::vector<PipelineSpec> matmul_pipelines(const VulkanContext& ctx, gguf::TensorType type, uint64_t cols, MatmulUse use) {
  if (!weight_type_supported(type) || !simd_matvec_fits(ctx, type, cols, gguf::type_bytes(type, cols))) return {};
  std::vector<PipelineSpec> specs;
  if (use.columns) specs.push_back(simd_matvec_spec(ctx, type, cols, k_simd_cols));
  if (use.one_column) specs.push_back(simd_matvec_spec(ctx, type, cols, 1));
  return specs;
}

void record_matmul(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                   uint32_t n_tokens, const BufferView& y, uint32_t y_stride, MatmulStore store, MatmulKernel kernel) {
  record_matmul_layout(rec, w, x, x_stride, n_tokens, y, MatmulLayout{y_stride}, store, kernel);
}

void record_matmul_split(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                         uint32_t n_tokens, std::span<const BufferView> outs, std::span<const uint32_t> rows,
                         MatmulKernel kernel) {
  VKLLM_CHECK(!outs.empty() && outs.size() == rows.size(), "record_matmul_split: one output per piece");
  uint64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    VKLLM_CHECK(outs[i].range >= uint64_t{n_tokens} * rows[i] * 4, "record_matmul_split: an output region is too small");
    total += rows[i];
  }
  VKLLM_CHECK(total == w.rows, "record_matmul_split: the pieces' rows do not add up to the weight's");
  MatmulLayout out{rows[0]};
  const BufferView& first = outs[0];
  uint64_t end = first.offset + first.range;
  if (outs.size() > 1) {
    auto index_of = [&](const BufferView& v) {
      VKLLM_CHECK(v.buffer == first.buffer && v.offset >= first.offset && (v.offset - first.offset) % 4 == 0,
                  "record_matmul_split: the pieces' outputs must follow the first in its buffer");
      return static_cast<uint32_t>((v.offset - first.offset) / 4);
    };
    out.seg_row = rows[0];
    out.seg_len = rows[1];
    out.seg_stride = rows[1];
    out.seg_base = index_of(outs[1]);
    out.seg_size = outs.size() > 2 ? index_of(outs[2]) - out.seg_base : 0;
    for (size_t i = 1; i < outs.size(); ++i) {
      VKLLM_CHECK(rows[i] == rows[1], "record_matmul_split: the pieces after the first differ in rows");
      VKLLM_CHECK(i < 2 || index_of(outs[i]) == out.seg_base + (i - 1) * out.seg_size,
                  "record_matmul_split: the pieces' outputs are not evenly spaced");
      end = std::max(end, outs[i].offset + outs[i].range);
    }
  }
  if (end - first.offset > rec.context().max_storage_range()) {
    // The regions together are more than one binding may cover: one record per piece, each on
    // its rows of the weight (which start on a binding boundary: WeightArena::upload_fused).
    VKLLM_CHECK(w.parts.size() == 1, "record_matmul_split: a fused weight in several parts");
    uint64_t row = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      DeviceTensor piece = w;
      piece.rows = rows[i];
      piece.parts = {{w.parts[0].view.sub(row * w.row_bytes, rows[i] * w.row_bytes), 0, rows[i]}};
      record_matmul(rec, piece, x, x_stride, n_tokens, outs[i], rows[i], MatmulStore::Overwrite, kernel);
      row += rows[i];
    }
    return;
  }
  record_matmul_layout(rec, w, x, x_stride, n_tokens, BufferView{first.buffer, first.offset, end - first.offset}, out,
                       MatmulStore::Overwrite, kernel);
}

void record_matmul_glu(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                       uint32_t n_tokens, const BufferView& gate, const BufferView& up, const BufferView& out, Glu act,
                       MatmulKernel kernel) {
  VKLLM_CHECK(w.rows % 2 == 0, "record_matmul_glu: a gate|up weight has an even number of rows");
  const uint32_t n = static_cast<uint32_t>(w.rows / 2);
  if (w.parts.size() == 1 && weight_kernel_for(rec.context(), w, w.parts[0], x, x_stride, n_tokens, kernel) != WeightKernel::Tiled) {
    MatmulLayout layout{n};
    layout.glu = static_cast<uint32_t>(act);
    record_matmul_layout(rec, w, x, x_stride, n_tokens, out, layout, MatmulStore::Overwrite, kernel);
    return;
  }
  const BufferView outs[] = {gate, up};
  const uint32_t rows[] = {n, n};
  record_matmul_split(rec, w, x, x_stride, n_tokens, outs, rows, kernel);
  rec.barrier();
  record_glu(rec, act, gate, up, out, n_tokens * n);
}

namespace {
// Whether read_ceiling strides its invocations' words (GPUs) or reads a run per invocation (CPU
// drivers), and how many words an invocation reads: a 4 KiB run, or 16 words (more where that many
// invocations would exceed the device's workgroup count).
constexpr uint32_t k_ceiling_run_words = 4096 / 16, k_ceiling_strided_words = 16;
bool read_ceiling_strided(const VulkanContext& ctx, std::optional<bool> strided) {
  return strided.value_or(ctx.info().type != "cpu");
}
uint32_t read_ceiling_words(const VulkanContext& ctx, bool strided, uint64_t data_bytes) {
  if (!strided) return k_ceiling_run_words;
  const uint64_t max_invocations = uint64_t{ctx.limits().maxComputeWorkGroupCount[0]} * 64;
  return static_cast<uint32_t>(std::max<uint64_t>(k_ceiling_strided_words, div_ceil(data_bytes / 16, max_invocations)));
}
}  // namespace

// Enough for any part of data_bytes too (bench --ops reads its buffer a binding at a time): an
// invocation reads at least k_ceiling_strided_words (or exactly k_ceiling_run_words) words.
uint64_t read_ceiling_out_bytes(const VulkanContext& ctx, uint64_t data_bytes, std::optional<bool> strided) {
  const uint32_t fewest = read_ceiling_strided(ctx, strided) ? k_ceiling_strided_words : k_ceiling_run_words;
  return div_ceil(data_bytes / 16, uint64_t{fewest}) * 4;
}

void record_read_ceiling(CommandRecorder& rec, const BufferView& data, const BufferView& out, bool texel,
                         std::optional<bool> strided) {
  const Pipeline& p = rec.pipelines().get(texel ? "read_ceiling_texel" : "read_ceiling", 2, sizeof(ReadCeilingParams), {64});
  const bool by_stride = read_ceiling_strided(rec.context(), strided);
  const uint32_t words = uint32_t(data.range / 16), per = read_ceiling_words(rec.context(), by_stride, data.range);
  const uint32_t invocations = div_ceil(words, per);
  const ReadCeilingParams params{words, per, by_stride ? invocations : 0};
  rec.dispatch(p, {data, out}, params, div_ceil(invocations, 64u));
}

}  // namespace vkllm
