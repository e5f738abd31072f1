// VulkanContext: the instance, the chosen physical device, its logical device and compute queue,
// and the limits every other part of the runtime must respect (queried, never assumed).
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"

namespace vkllm {

// Throws std::logic_error naming the call and the VkResult when a Vulkan call fails.
void vk_check_failed(VkResult r, const char* call, const char* file, int line);
#define VK_CHECK(call)                                                          \
  do {                                                                          \
    VkResult vk_check_result_ = (call);                                         \
    if (vk_check_result_ != VK_SUCCESS) ::vkllm::vk_check_failed(vk_check_result_, #call, __FILE__, __LINE__); \
  } while (0)
const char* vk_result_name(VkResult r);

// What `vkllm devices` shows about one physical device.
struct DeviceInfo {
  uint32_t index = 0;
  std::string name;
  std::string type;            // "discrete", "integrated", "virtual", "cpu", "other"
  std::string driver;          // driver name and info
  std::string api_version;     // "1.3.239"
  std::vector<std::pair<uint64_t, bool>> heaps;  // (bytes, device-local)
  uint32_t subgroup_size = 0;
  bool subgroup_shuffle = false;  // subgroup shuffles in compute shaders
  bool fp16 = false;           // shaderFloat16
  bool int8 = false;           // shaderInt8
  bool int64 = false;          // shaderInt64 (enabled when present)
  // A CPU driver on a host with AVX-512 DQ: a 64-bit integer multiply over a subgroup is one
  // instruction, so matvec_simd packs four Q4_0 columns per multiply (docs/shaders.md).
  bool wide_int64 = false;
  bool scalar_layout = false;  // scalarBlockLayout (enabled when present)
  // shaderIntegerDotProduct (VK_KHR_shader_integer_dot_product, enabled when present): matvec's
  // 8-bit x path (MatvecTuning::q8x).
  bool int_dot = false;
  bool storage16 = false;      // storageBuffer16BitAccess
  bool storage8 = false;       // storageBuffer8BitAccess
  bool push_descriptor = false;
  // Arrays of storage buffers indexed by a dynamically uniform value (enabled when present): one
  // dispatch reads several sequences' caches (docs/server.md). (Arrays of texel buffers are indexed
  // by constants: lavapipe indexes no others.)
  bool binding_arrays = false;
  uint32_t max_push_descriptors = 0;  // descriptors one push may write (all bindings' array elements)
  uint64_t max_storage_buffer_range = 0;
  uint64_t max_allocation_size = 0;
  uint32_t max_shared_memory = 0;
  uint32_t max_workgroup_invocations = 0;
  std::string missing;         // required features this device lacks ("" when usable)
};

struct ContextOptions {
  std::optional<uint32_t> device_index;  // --device N; default: discrete > integrated > virtual > cpu
  bool validate = false;                 // enable VK_LAYER_KHRONOS_validation (also VKLLM_VALIDATE=1)
  std::optional<bool> wide_int64;        // tests: DeviceInfo::wide_int64 forced (where int64 is supported)
};

class VulkanContext {
 public:
  explicit VulkanContext(const ContextOptions& o = {});
  ~VulkanContext();
  VulkanContext(const VulkanContext&) = delete;
  VulkanContext& operator=(const VulkanContext&) = delete;

  VkInstance instance() const { return instance_; }
  VkPhysicalDevice physical() const { return physical_; }
  VkDevice device() const { return device_; }
  VkQueue queue() const { return queue_; }
  uint32_t queue_family() const { return queue_family_; }
  const DeviceInfo& info() const { return info_; }
  const VkPhysicalDeviceLimits& limits() const { return limits_; }
  const VkPhysicalDeviceMemoryProperties& memory() const { return memory_; }
  uint32_t subgroup_size() const { return info_.subgroup_size; }
  uint64_t max_storage_range() const { return info_.max_storage_buffer_range; }
  float timestamp_period_ns() const { return limits_.timestampPeriod; }
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_fn() const { return push_descriptor_; }

  // The storage texel buffer view of bytes [offset, offset + range) of `buffer` (range 0: to its
  // end) in `format`, made on first use and kept until drop_texel_views(buffer): what a kernel's
  // `uimageBuffer` binding reads (lavapipe serves texel loads several times faster than storage
  // buffer loads, docs/performance.md). The range is cut to whole texels. Thread-safe.
  VkBufferView texel_view(VkBuffer buffer, uint64_t offset, uint64_t range, VkFormat format) const;
  // Destroys the texel views of `buffer` (Buffer does, before it destroys the buffer).
  void drop_texel_views(VkBuffer buffer) const;

  // Validation messages seen since creation (only with validation on). Tests require none. The
  // layer calls back on whichever thread made the call (pipelines are made on several).
  std::vector<std::string> validation_messages() const {
    std::lock_guard lock(messages_mutex_);
    return messages_;
  }
  // Names a Vulkan object for validation messages and debuggers (no-op without debug utils).
  void set_name(VkObjectType type, uint64_t handle, const std::string& name) const;

 private:
  void release();
  static VkBool32 VKAPI_PTR on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT, VkDebugUtilsMessageTypeFlagsEXT,
                                             const VkDebugUtilsMessengerCallbackDataEXT*, void*);

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  DeviceInfo info_;
  VkPhysicalDeviceLimits limits_{};
  VkPhysicalDeviceMemoryProperties memory_{};
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_ = nullptr;
  PFN_vkSetDebugUtilsObjectNameEXT set_name_ = nullptr;
  std::vector<std::string> messages_;
  mutable std::mutex messages_mutex_;
  mutable std::mutex texel_mutex_;
  mutable std::map<VkBuffer, std::map<std::tuple<uint64_t, uint64_t, VkFormat>, VkBufferView>> texel_views_;
};

// Every physical device with what vkllm needs to know about it; creates its own instance.
std::vector<DeviceInfo> list_devices();

}  // namespace vkllm
