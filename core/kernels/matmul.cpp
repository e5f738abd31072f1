// Recording of the weight-reading kernels: get_rows, matvec and matmul, per weight part.
#include <cctype>

#include "kernels/params.h"
#include "kernels/ops.h"

namespace vkllm {

bool weight_type_supported(gguf::TensorType t) {
  using T = gguf::TensorType;
  switch (t) {
    case T::F32: case T::F16: case T::BF16: case T::Q4_0: case T::Q4_1: case T::Q5_0: case T::Q5_1: case T::Q8_0:
    case T::Q2_K: case T::Q3_K: case T::Q4_K: case T::Q5_K: case T::Q6_K:
      return true;
    default:
      return false;
  }
}

std::string weight_kernel_suffix(const DeviceTensor& w) {
  if (!weight_type_supported(w.type))
    throw Error("tensor '" + w.name + "' has type " + gguf::type_name(w.type) + ", which vkllm cannot run yet");
  std::string s = gguf::type_name(w.type);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void record_get_rows(CommandRecorder& rec, const DeviceTensor& w, const BufferView& ids, uint32_t n_tokens,
                     const BufferView& out, uint32_t out_stride) {
  const Pipeline& p = rec.pipelines().get("get_rows_" + weight_kernel_suffix(w), 3, sizeof(GetRowsParams), {64});
  for (const WeightPart& part : w.parts) {
    const GetRowsParams params{n_tokens, uint32_t(w.cols), uint32_t(w.row_bytes), part.row_begin, part.n_rows, out_stride};
    rec.dispatch(p, {part.view, ids, out}, params, div_ceil(div_ceil(w.cols, 8), 64), n_tokens);
  }
}

void record_matmul(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                   uint32_t n_tokens, const BufferView& y, uint32_t y_stride) {
  const std::string suffix = weight_kernel_suffix(w);
  const uint32_t max_groups = rec.context().limits().maxComputeWorkGroupCount[0];
  for (const WeightPart& part : w.parts) {
    const MatmulParams params{uint32_t(w.cols), part.n_rows, uint32_t(w.row_bytes), n_tokens, x_stride, y_stride, part.row_begin};
    if (n_tokens == 1) {
      // One subgroup per row: a workgroup of 64 covers 64 / subgroup-size rows (at least 1).
      const uint32_t rows_per_wg = std::max<uint32_t>(64 / std::max<uint32_t>(rec.context().subgroup_size(), 1), 1);
      const Pipeline& p = rec.pipelines().get("matvec_" + suffix, 3, sizeof(MatmulParams), {64, rows_per_wg});
      const uint32_t groups = div_ceil(part.n_rows, rows_per_wg);
      const uint32_t gx = std::min(groups, max_groups);  // folded into y past the x limit
      rec.dispatch(p, {part.view, x, y}, params, gx, div_ceil(groups, gx));
    } else {
      const Pipeline& p = rec.pipelines().get("matmul_" + suffix, 3, sizeof(MatmulParams), {256});
      rec.dispatch(p, {part.view, x, y}, params, div_ceil(part.n_rows, 64), div_ceil(n_tokens, 32));
    }
  }
}

}  // namespace vkllm
