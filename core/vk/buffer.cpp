// Buffer allocation with memory-type selection, and staged transfers.
#include "vk/buffer.h"

#include <cstring>
#include <sys/mman.h>
#include <utility>

#include "vk/commands.h"

namespace vkllm {
namespace {

// The first memory type allowed by `bits` that has all of `want`, preferring ones without `avoid`.
int find_memory_type(const VkPhysicalDeviceMemoryProperties& mem, uint32_t bits, VkMemoryPropertyFlags want,
                     VkMemoryPropertyFlags avoid) {
  int fallback = -1;
  for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
    if (!(bits & (1u << i))) continue;
    const VkMemoryPropertyFlags f = mem.memoryTypes[i].propertyFlags;
    if ((f & want) != want) continue;
    if (!(f & avoid)) return static_cast<int>(i);
    if (fallback < 0) fallback = static_cast<int>(i);
  }
  return fallback;
}

// On a CPU driver device memory is ordinary process memory, and a shader streaming weights or the
// KV cache through 4 KiB pages spends much of its time in page walks (more so in a virtual machine):
// lavapipe's texel-load ceiling doubles on 2 MiB pages (docs/performance.md, "Huge pages for device
// memory on CPU drivers"). So the mapping of a large device buffer is advised to use transparent
// huge pages before anything touches it. Only advice: where the kernel has them off or the memory
// is not anonymous, nothing changes.
void advise_huge_pages(void* mapped, uint64_t size) {
  constexpr uintptr_t huge = uintptr_t{2} << 20;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t lo = (begin + huge - 1) & ~(huge - 1), hi = (begin + size) & ~(huge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
}

}  // namespace

Buffer::Buffer(const VulkanContext& ctx, uint64_t size, MemoryUse use, const std::string& name) : ctx_(&ctx), size_(size) {
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = size ? size : 4;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
              VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VK_CHECK(vkCreateBuffer(ctx.device(), &bci, nullptr, &buffer_));
  ctx.set_name(VK_OBJECT_TYPE_BUFFER, reinterpret_cast<uint64_t>(buffer_), name);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(ctx.device(), buffer_, &req);

  const auto& mem = ctx.memory();
  int type = -1;
  switch (use) {
    case MemoryUse::Device:
      type = find_memory_type(mem, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
      break;
    case MemoryUse::Upload:
      type = find_memory_type(mem, req.memoryTypeBits,
                              VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
      break;
    case MemoryUse::Readback:
      // Coherent memory only, so no flush/invalidate is ever needed; cached when there is such.
      type = find_memory_type(mem, req.memoryTypeBits,
                              VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                  VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0);
      if (type < 0)
        type = find_memory_type(mem, req.memoryTypeBits,
                                VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
      break;
  }
  if (type < 0) {
    release();
    throw Error("device " + ctx.info().name + " has no suitable memory type for buffer '" + name + "'");
  }
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = static_cast<uint32_t>(type);
  const VkResult r = vkAllocateMemory(ctx.device(), &ai, nullptr, &memory_);
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) {
    release();
    throw Error("out of device memory allocating " + std::to_string(size) + " bytes for '" + name + "' on " + ctx.info().name);
  }
  VK_CHECK(r);
  VK_CHECK(vkBindBufferMemory(ctx.device(), buffer_, memory_, 0));
  const VkMemoryPropertyFlags flags = mem.memoryTypes[type].propertyFlags;
  // Device memory that is also host-visible (lavapipe, integrated GPUs, resizable BAR) is mapped
  // when coherent, so uploads skip the staging copy.
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  if ((flags & host) == host) VK_CHECK(vkMapMemory(ctx.device(), memory_, 0, VK_WHOLE_SIZE, 0, &mapped_));
  if (mapped_ && use == MemoryUse::Device && ctx.info().type == "cpu") advise_huge_pages(mapped_, req.size);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    ctx_ = o.ctx_;
    buffer_ = std::exchange(o.buffer_, VK_NULL_HANDLE);
    memory_ = std::exchange(o.memory_, VK_NULL_HANDLE);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (!ctx_) return;
  if (buffer_) ctx_->drop_texel_views(buffer_);
  if (memory_ && mapped_) vkUnmapMemory(ctx_->device(), memory_);
  if (buffer_) vkDestroyBuffer(ctx_->device(), buffer_, nullptr);
  if (memory_) vkFreeMemory(ctx_->device(), memory_, nullptr);
  buffer_ = VK_NULL_HANDLE;
  memory_ = VK_NULL_HANDLE;
  mapped_ = nullptr;
}

void upload(const VulkanContext& ctx, const Buffer& dst, uint64_t offset, const void* src, uint64_t bytes) {
  VKLLM_CHECK(offset + bytes <= dst.size(), "upload past the end of a buffer");
  if (bytes == 0) return;
  if (dst.host_visible()) {
    std::memcpy(static_cast<uint8_t*>(dst.mapped()) + offset, src, bytes);
    return;
  }
  constexpr uint64_t k_chunk = 64ull << 20;
  Buffer staging(ctx, std::min(bytes, k_chunk), MemoryUse::Upload, "staging upload");
  for (uint64_t done = 0; done < bytes; done += k_chunk) {
    const uint64_t n = std::min(k_chunk, bytes - done);
    std::memcpy(staging.mapped(), static_cast<const uint8_t*>(src) + done, n);
    CommandRecorder rec(ctx);
    rec.copy(staging.view(0, n), dst.view(offset + done, n));
    rec.submit_and_wait();
  }
}

void download(const VulkanContext& ctx, const Buffer& src, uint64_t offset, void* dst, uint64_t bytes) {
  VKLLM_CHECK(offset + bytes <= src.size(), "download past the end of a buffer");
  if (bytes == 0) return;
  if (src.host_visible()) {
    std::memcpy(dst, static_cast<const uint8_t*>(src.mapped()) + offset, bytes);
    return;
  }
  constexpr uint64_t k_chunk = 64ull << 20;
  Buffer staging(ctx, std::min(bytes, k_chunk), MemoryUse::Readback, "staging download");
  for (uint64_t done = 0; done < bytes; done += k_chunk) {
    const uint64_t n = std::min(k_chunk, bytes - done);
    CommandRecorder rec(ctx);
    rec.copy(src.view(offset + done, n), staging.view(0, n));
    rec.submit_and_wait();
    std::memcpy(static_cast<uint8_t*>(dst) + done, staging.mapped(), n);
  }
}

}  // namespace vkllm
