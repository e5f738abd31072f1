// Weights in device memory: tensors sub-allocated from a few large buffers and bound as
// (buffer, offset, range) parts no larger than the device's maxStorageBufferRange.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gguf.h"
#include "vk/buffer.h"

namespace vkllm {

// A run of whole rows of a weight tensor that one descriptor binding can hold.
struct WeightPart {
  BufferView view;
  uint32_t row_begin = 0;  // first row held
  uint32_t n_rows = 0;
};

// A 1-D or 2-D tensor in device memory: rows × cols elements of `type`, row-major.
struct DeviceTensor {
  std::string name;
  gguf::TensorType type = gguf::TensorType::F32;
  uint64_t cols = 0;       // ne[0]: elements per row
  uint64_t rows = 0;       // product of the other dimensions
  uint64_t row_bytes = 0;
  std::vector<WeightPart> parts;  // covering rows 0..rows in order

  const BufferView& whole() const;  // the single part of a tensor that fits one binding
};

// Owns the device buffers weights live in; hands out aligned ranges, each followed by padding to
// a multiple of 16 bytes (so a range may be bound as whole 16-byte texels).
class WeightArena {
 public:
  // `max_part_bytes` (0: the device's binding limit) caps one part; tests set it small to
  // exercise tensors split across bindings.
  explicit WeightArena(const VulkanContext& ctx, uint64_t max_part_bytes = 0);
  // Uploads `t` (its bytes from the mapped GGUF), splitting it into row parts that each fit a
  // binding. `on_bytes` is told how many bytes were uploaded (progress).
  DeviceTensor upload(const gguf::TensorInfo& t, const std::function<void(uint64_t)>& on_bytes = {});
  // Uploads rows row_begin … row_begin + n_rows − 1 of a matrix as a tensor of its own (a part of
  // a fused tensor), named "<name>[row_begin:row_end]".
  DeviceTensor upload_rows_of(const gguf::TensorInfo& t, uint64_t row_begin, uint64_t n_rows,
                              const std::function<void(uint64_t)>& on_bytes = {});
  // A row range of a GGUF matrix: one piece of a fused tensor.
  struct RowRange {
    const gguf::TensorInfo* info;
    uint64_t row_begin, n_rows;
  };
  struct Fused {
    DeviceTensor whole;               // the ranges' rows, one after another, in one binding
    std::vector<DeviceTensor> pieces; // each range's rows: a view into `whole`
  };
  // Uploads `ranges` one after another as one tensor `name`, so one dispatch can read them all
  // (q|k|v, gate|up). Nothing (and nothing uploaded) when they differ in type or row length, when
  // the whole does not fit one binding, or when a piece would start off the device's binding
  // alignment: the caller then uploads them one by one.
  std::optional<Fused> upload_fused(const std::string& name, std::span<const RowRange> ranges,
                                    const std::function<void(uint64_t)>& on_bytes = {});
  // Uploads raw rows (tests and synthetic data).
  DeviceTensor upload(const std::string& name, gguf::TensorType type, uint64_t cols, uint64_t rows, const void* data);
  uint64_t bytes_allocated() const { return allocated_; }

 private:
  DeviceTensor upload_rows(const std::string& name, gguf::TensorType type, uint64_t cols, uint64_t rows,
                           const uint8_t* data, const std::function<void(uint64_t)>& on_bytes);
  // Room for `bytes` in the current chunk (a new one when full): the chunk and the offset.
  std::pair<Buffer*, uint64_t> allocate(uint64_t bytes);
  void copy_in(Buffer& dst, uint64_t offset, const uint8_t* src, uint64_t bytes, const std::function<void(uint64_t)>& on_bytes);
  const VulkanContext& ctx_;
  std::vector<std::unique_ptr<Buffer>> chunks_;
  std::unique_ptr<Buffer> staging_;  // for device memory the CPU cannot map
  uint64_t max_part_bytes_ = 0;
  uint64_t chunk_used_ = 0;
  uint64_t allocated_ = 0;
};

}  // namespace vkllm
