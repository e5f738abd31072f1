// Weight upload into sub-allocated device buffers, split into binding-sized row parts.
#include "kernels/tensor.h"

#include <algorithm>
#include <cstring>

#include "vk/commands.h"

namespace vkllm {
namespace {

// Rows of a GGUF tensor: the product of its dimensions past the first.
uint64_t tensor_rows(const gguf::TensorInfo& info) {
  uint64_t rows = 1;
  for (uint32_t d = 1; d < info.n_dims; ++d) rows *= info.ne[d];
  return rows;
}

}  // namespace

const BufferView& DeviceTensor::whole() const {
  VKLLM_CHECK(parts.size() == 1, "tensor '" + name + "' is split into " + std::to_string(parts.size()) +
                                     " parts; this use needs it in one binding");
  return parts[0].view;
}

WeightArena::WeightArena(const VulkanContext& ctx, uint64_t max_part_bytes) : ctx_(ctx) {
  max_part_bytes_ = std::min<uint64_t>(ctx.max_storage_range(), 1ull << 30);
  if (max_part_bytes) max_part_bytes_ = std::min(max_part_bytes_, max_part_bytes);
}

std::pair<Buffer*, uint64_t> WeightArena::allocate(uint64_t bytes) {
  const uint64_t align = std::max<uint64_t>(ctx_.limits().minStorageBufferOffsetAlignment, 16);
  // Chunks of at most 1 GiB (and the device's allocation limit): few allocations, none huge.
  const uint64_t chunk_size = std::min<uint64_t>(ctx_.info().max_allocation_size, 1ull << 30);
  // Each tensor is followed by padding to 16 bytes inside its chunk, so a kernel may bind its range
  // rounded up to whole 16-byte texels (matvec_simd).
  const uint64_t padded = (bytes + 15) / 16 * 16;
  VKLLM_CHECK(padded <= chunk_size, "weight part larger than an allocation");
  chunk_used_ = (chunk_used_ + align - 1) / align * align;
  if (chunks_.empty() || chunk_used_ + padded > chunks_.back()->size()) {
    const uint64_t size = std::max<uint64_t>(std::min<uint64_t>(chunk_size, 256ull << 20), padded);
    chunks_.push_back(std::make_unique<Buffer>(ctx_, size, MemoryUse::Device, "weights " + std::to_string(chunks_.size())));
    chunk_used_ = 0;
  }
  const uint64_t offset = chunk_used_;
  chunk_used_ += bytes;
  allocated_ += bytes;
  return {chunks_.back().get(), offset};
}

void WeightArena::copy_in(Buffer& dst, uint64_t offset, const uint8_t* src, uint64_t bytes,
                          const std::function<void(uint64_t)>& on_bytes) {
  constexpr uint64_t k_step = 32ull << 20;  // progress granularity and staging size
  if (!dst.host_visible() && !staging_)
    staging_ = std::make_unique<Buffer>(ctx_, k_step, MemoryUse::Upload, "weight staging");
  for (uint64_t done = 0; done < bytes; done += k_step) {
    const uint64_t n = std::min(k_step, bytes - done);
    if (dst.host_visible()) {
      std::memcpy(static_cast<uint8_t*>(dst.mapped()) + offset + done, src + done, n);
    } else {
      std::memcpy(staging_->mapped(), src + done, n);
      CommandRecorder rec(ctx_);
      rec.copy(staging_->view(0, n), dst.view(offset + done, n));
      rec.submit_and_wait();
    }
    if (on_bytes) on_bytes(n);
  }
}

DeviceTensor WeightArena::upload(const gguf::TensorInfo& info, const std::function<void(uint64_t)>& on_bytes) {
  return upload_rows(info.name, info.type, info.ne[0], tensor_rows(info), info.data, on_bytes);
}

DeviceTensor WeightArena::upload_rows_of(const gguf::TensorInfo& info, uint64_t row_begin, uint64_t n_rows,
                                         const std::function<void(uint64_t)>& on_bytes) {
  VKLLM_CHECK(row_begin + n_rows <= tensor_rows(info), "row range past the tensor");
  const std::string name = info.name + "[" + std::to_string(row_begin) + ":" + std::to_string(row_begin + n_rows) + "]";
  return upload_rows(name, info.type, info.ne[0], n_rows, info.data + row_begin * gguf::type_bytes(info.type, info.ne[0]),
                     on_bytes);
}

std::optional<WeightArena::Fused> WeightArena::upload_fused(const std::string& name, std::span<const RowRange> ranges,
                                                            const std::function<void(uint64_t)>& on_bytes) {
  if (ranges.empty()) return std::nullopt;
  const gguf::TensorInfo& first = *ranges[0].info;
  const uint64_t row_bytes = gguf::type_bytes(first.type, first.ne[0]);
  const uint64_t align = std::max<uint64_t>(ctx_.limits().minStorageBufferOffsetAlignment, 16);
  uint64_t rows = 0;
  for (const RowRange& r : ranges) {
    if (r.info->type != first.type || r.info->ne[0] != first.ne[0] || r.row_begin + r.n_rows > tensor_rows(*r.info)) return std::nullopt;
    if (rows * row_bytes % align != 0) return std::nullopt;
    rows += r.n_rows;
  }
  const uint64_t bytes = rows * row_bytes;
  if (row_bytes == 0 || bytes > max_part_bytes_ || rows > UINT32_MAX) return std::nullopt;
  auto [chunk, offset] = allocate(bytes);
  Fused f;
  f.whole = DeviceTensor{name, first.type, first.ne[0], rows, row_bytes, {{chunk->view(offset, bytes), 0, uint32_t(rows)}}};
  uint64_t at = 0;
  for (const RowRange& r : ranges) {
    const uint64_t n = r.n_rows * row_bytes;
    copy_in(*chunk, offset + at, r.info->data + r.row_begin * row_bytes, n, on_bytes);
    const bool whole_tensor = r.row_begin == 0 && r.n_rows == tensor_rows(*r.info);
    const std::string piece = whole_tensor ? r.info->name
                                           : r.info->name + "[" + std::to_string(r.row_begin) + ":" +
                                                 std::to_string(r.row_begin + r.n_rows) + "]";
    f.pieces.push_back(DeviceTensor{piece, first.type, first.ne[0], r.n_rows, row_bytes,
                                    {{chunk->view(offset + at, n), 0, uint32_t(r.n_rows)}}});
    at += n;
  }
  return f;
}

DeviceTensor WeightArena::upload(const std::string& name, gguf::TensorType type, uint64_t cols, uint64_t rows,
                                 const void* data) {
  return upload_rows(name, type, cols, rows, static_cast<const uint8_t*>(data), {});
}

DeviceTensor WeightArena::upload_rows(const std::string& name, gguf::TensorType type, uint64_t cols, uint64_t rows,
                                      const uint8_t* data, const std::function<void(uint64_t)>& on_bytes) {
  DeviceTensor t;
  t.name = name;
  t.type = type;
  t.cols = cols;
  t.rows = rows;
  t.row_bytes = gguf::type_bytes(type, cols);
  const uint64_t range = max_part_bytes_;
  if (t.row_bytes == 0 || t.row_bytes > range)
    throw Error("tensor '" + name + "': a row of " + std::to_string(t.row_bytes) +
                " bytes cannot be bound on this device (limit " + std::to_string(range) + ")");
  const uint64_t rows_per_part = std::min<uint64_t>(range / t.row_bytes, UINT32_MAX);
  uint64_t r = 0;
  do {
    const uint64_t n = std::min(rows_per_part, rows - r);
    const uint64_t bytes = n * t.row_bytes;
    auto [chunk, offset] = allocate(std::max<uint64_t>(bytes, 16));
    copy_in(*chunk, offset, data + r * t.row_bytes, bytes, on_bytes);
    t.parts.push_back({chunk->view(offset, std::max<uint64_t>(bytes, 16)), static_cast<uint32_t>(r), static_cast<uint32_t>(n)});
    r += n;
  } while (r < rows);
  return t;
}

}  // namespace vkllm
