// Buffers in device memory: RAII Buffer, the BufferView a dispatch binds, and upload/download.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>

#include "vk/context.h"

namespace vkllm {

enum class MemoryUse {
  Device,    // device-local; read and written by shaders only (weights, KV cache, activations)
  Upload,    // host-visible, written by the CPU, read by shaders (token ids, positions, slots)
  Readback,  // host-visible and cached, written by shaders, read by the CPU (logits)
};

// What one descriptor binding sees: a range of a VkBuffer. `range` never exceeds the device's
// maxStorageBufferRange and `offset` is a multiple of minStorageBufferOffsetAlignment.
struct BufferView {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t offset = 0;
  uint64_t range = 0;
  BufferView sub(uint64_t off, uint64_t len) const { return {buffer, offset + off, len}; }
  // The whole buffer (range 0: to its end): a texel binding that stays one view whatever part of
  // the buffer a dispatch reads, the part found from an offset in the push constants.
  BufferView whole() const { return {buffer, 0, 0}; }
};

// One VkBuffer with its own memory allocation.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const VulkanContext& ctx, uint64_t size, MemoryUse use, const std::string& name);
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer();

  VkBuffer handle() const { return buffer_; }
  uint64_t size() const { return size_; }
  bool host_visible() const { return mapped_ != nullptr; }
  void* mapped() const { return mapped_; }      // non-null when host-visible
  BufferView view() const { return {buffer_, 0, size_}; }
  BufferView view(uint64_t off, uint64_t len) const { return {buffer_, off, len}; }

 private:
  void release();
  const VulkanContext* ctx_ = nullptr;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  uint64_t size_ = 0;
  void* mapped_ = nullptr;
};

// Copies host bytes into a device buffer range (through a staging buffer unless it is mapped).
void upload(const VulkanContext& ctx, const Buffer& dst, uint64_t offset, const void* src, uint64_t bytes);
// Copies a device buffer range to host memory.
void download(const VulkanContext& ctx, const Buffer& src, uint64_t offset, void* dst, uint64_t bytes);

}  // namespace vkllm
