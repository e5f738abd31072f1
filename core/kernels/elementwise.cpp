// Recording of the element-wise and row kernels: add, mul, scale, softcap, swiglu, geglu, rms_norm, softmax, argmax.
#include <algorithm>

#include "kernels/params.h"
#include "kernels/ops.h"

namespace vkllm {
namespace {

constexpr uint32_t k_wg = 256;  // workgroup size of the element-wise kernels

// Dispatches n invocations of a 1-D kernel, folding into y past the device's x limit.
template <typename Params>
void dispatch_1d(CommandRecorder& rec, const Pipeline& p, std::initializer_list<BufferView> buffers, const Params& params,
                 uint64_t n) {
  const uint32_t groups = div_ceil(n, k_wg);
  const uint32_t gx = std::min(groups, rec.context().limits().maxComputeWorkGroupCount[0]);
  rec.dispatch(p, buffers, params, gx, div_ceil(groups, gx));
}

// Workgroup size of the row kernels: a power of two from one subgroup up to `most` (256 unless the
// kernel says otherwise), doubled while the row has more than `per_invocation` elements per invocation.
uint32_t row_wg(const CommandRecorder& rec, uint32_t n_cols, uint32_t most = 256, uint32_t per_invocation = 1) {
  uint32_t wg = rec.context().subgroup_size();
  while (wg * 2 <= most && wg * per_invocation < n_cols) wg *= 2;
  return wg;
}

// rms_norm's workgroup size: one subgroup on CPU drivers, where the lanes are the SIMD width and
// a barrier between subgroups is a switch between them (≈ 40% less rms_norm time per decode step
// on lavapipe, docs/performance.md). On GPUs a decode step's one row is the whole dispatch, and
// each invocation's loads wait in turn: up to 1,024 invocations (and 32 subgroups of the reported
// size: the shader holds 128 partial sums) with about 4 elements each (256 invocations of 16
// took ≈ 11 µs for a 4,096 row on an H200).
uint32_t norm_wg(const CommandRecorder& rec, uint32_t n_cols) {
  const VulkanContext& ctx = rec.context();
  const uint32_t sg = ctx.subgroup_size();
  if (ctx.info().type == "cpu") return sg;
  const VkPhysicalDeviceLimits& l = ctx.limits();
  return row_wg(rec, n_cols, std::min({1024u, l.maxComputeWorkGroupInvocations, l.maxComputeWorkGroupSize[0], 32 * sg}), 4);
}

// rms_norm_texel (CPU drivers, where rms_norm is one subgroup per row): rows of whole 16-byte
// texels, x and out at texel offsets of their buffers, w on a texel view's alignment.
bool norm_as_texels(const CommandRecorder& rec, const BufferView& x, uint32_t x_stride, const BufferView& w,
                    const BufferView& out, uint32_t out_stride, uint32_t n_cols) {
  const VulkanContext& ctx = rec.context();
  const uint64_t align = std::max<uint64_t>(ctx.limits().minTexelBufferOffsetAlignment, 1);
  return ctx.info().type == "cpu" && n_cols % 4 == 0 && x_stride % 4 == 0 && out_stride % 4 == 0 && x.offset % 16 == 0 &&
         out.offset % 16 == 0 && w.offset % align == 0 && x.offset / 16 <= UINT32_MAX && out.offset / 16 <= UINT32_MAX;
}

}  // namespace

void record_add(CommandRecorder& rec, const BufferView& a, const BufferView& b, const BufferView& out, uint32_t n,
                uint32_t b_period) {
  dispatch_1d(rec, rec.pipelines().get("add", 3, sizeof(BinaryParams), {k_wg}), {a, b, out}, BinaryParams{n, b_period}, n);
}

void record_mul(CommandRecorder& rec, const BufferView& a, const BufferView& b, const BufferView& out, uint32_t n,
                uint32_t b_period) {
  dispatch_1d(rec, rec.pipelines().get("mul", 3, sizeof(BinaryParams), {k_wg}), {a, b, out}, BinaryParams{n, b_period}, n);
}

void record_scale(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n, float s) {
  dispatch_1d(rec, rec.pipelines().get("scale", 2, sizeof(ScaleParams), {k_wg}), {x, out}, ScaleParams{n, s}, n);
}

void record_swiglu(CommandRecorder& rec, const BufferView& gate, const BufferView& up, const BufferView& out, uint32_t n) {
  dispatch_1d(rec, rec.pipelines().get("swiglu", 3, sizeof(ScaleParams), {k_wg}), {gate, up, out}, ScaleParams{n, 0.0f}, n);
}

void record_geglu(CommandRecorder& rec, const BufferView& gate, const BufferView& up, const BufferView& out, uint32_t n) {
  dispatch_1d(rec, rec.pipelines().get("geglu", 3, sizeof(ScaleParams), {k_wg}), {gate, up, out}, ScaleParams{n, 0.0f}, n);
}

void record_glu(CommandRecorder& rec, Glu act, const BufferView& gate, const BufferView& up, const BufferView& out, uint32_t n) {
  if (act == Glu::GELU) record_geglu(rec, gate, up, out, n);
  else record_swiglu(rec, gate, up, out, n);
}

void record_softcap(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n, float cap) {
  dispatch_1d(rec, rec.pipelines().get("softcap", 2, sizeof(ScaleParams), {k_wg}), {x, out}, ScaleParams{n, cap}, n);
}

void record_rms_norm(CommandRecorder& rec, const BufferView& x, uint32_t x_stride, const BufferView& w, const BufferView& out,
                     uint32_t out_stride, uint32_t n_rows, uint32_t n_cols, float eps) {
  const uint32_t wg = norm_wg(rec, n_cols);
  if (norm_as_texels(rec, x, x_stride, w, out, out_stride, n_cols)) {
    // x and out as their whole buffers (one texel view each whatever the rows), row 0 at a base.
    const Pipeline& p = rec.pipelines().get("rms_norm_texel", 3, sizeof(NormParams), {wg});
    const NormParams params{n_rows, n_cols, x_stride, out_stride, eps, uint32_t(x.offset / 16), uint32_t(out.offset / 16)};
    rec.dispatch(p, {x.whole(), w, out.whole()}, params, n_rows);
    return;
  }
  const Pipeline& p = rec.pipelines().get("rms_norm", 3, sizeof(NormParams), {wg});
  rec.dispatch(p, {x, w, out}, NormParams{n_rows, n_cols, x_stride, out_stride, eps, 0, 0}, n_rows);
}

void record_softmax(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n_rows, uint32_t n_cols) {
  const Pipeline& p = rec.pipelines().get("softmax", 2, sizeof(RowParams), {row_wg(rec, n_cols)});
  rec.dispatch(p, {x, out}, RowParams{n_rows, n_cols}, n_rows);
}

void record_log_softmax(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n_rows, uint32_t n_cols) {
  const Pipeline& p = rec.pipelines().get("log_softmax", 2, sizeof(RowParams), {row_wg(rec, n_cols)});
  rec.dispatch(p, {x, out}, RowParams{n_rows, n_cols}, n_rows);
}

void record_argmax(CommandRecorder& rec, const BufferView& x, const BufferView& out, uint32_t n_rows, uint32_t n_cols) {
  const Pipeline& p = rec.pipelines().get("argmax", 2, sizeof(RowParams), {row_wg(rec, n_cols)});
  rec.dispatch(p, {x, out}, RowParams{n_rows, n_cols}, n_rows);
}

}  // namespace vkllm
