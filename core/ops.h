// record_<op>: one function per shader family, recording its dispatches into a CommandRecorder.
// Shapes use the notation of docs/architecture.md: [outer]…[inner] type, innermost contiguous.
// Callers insert rec.barrier() between dependent ops.
#pragma once
#include <cstdint>

#include "kv_layout.h"
#include "vk_commands.h"
#include "weights.h"

namespace vkllm {

// The shader variant suffix of a weight type ("q4_k"), or an Error naming the tensor when vkllm
// has no kernel for it.
std::string weight_kernel_suffix(const DeviceTensor& w);
bool weight_type_supported(gguf::TensorType t);

// out[t][0..cols) = dequant(w[ids[t]])      ids [n_tokens] i32 → out [n_tokens][out_stride] f32
void record_get_rows(CommandRecorder& rec, const DeviceTensor& w, const BufferView& ids, uint32_t n_tokens,
                     const BufferView& out, uint32_t out_stride);

// y[t][r] = w[r] · x[t]    x [n_tokens][x_stride] f32 → y [n_tokens][y_stride] f32, r < w.rows.
// One token uses the matvec kernel, more use the tiled matmul.
void record_matmul(CommandRecorder& rec, const DeviceTensor& w, const BufferView& x, uint32_t x_stride,
                   uint32_t n_tokens, const BufferView& y, uint32_t y_stride);

}  // namespace vkllm
