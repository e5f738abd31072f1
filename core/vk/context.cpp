// Vulkan instance and device selection, feature checks, validation messages.
#include "vk/context.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace vkllm {

const char* vk_result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED: return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default: return "VkResult(other)";
  }
}

void vk_check_failed(VkResult r, const char* call, const char* file, int line) {
  const std::string where = std::string(file) + ":" + std::to_string(line);
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
    throw Error(std::string("the Vulkan device ran out of memory (") + vk_result_name(r) + " from " + call + ")");
  if (r == VK_ERROR_DEVICE_LOST)
    throw Error(std::string("the Vulkan device was lost (driver reset or crash) during ") + call);
  throw std::logic_error(std::string(call) + " failed with " + vk_result_name(r) + " at " + where);
}

namespace {

constexpr const char* k_validation_layer = "VK_LAYER_KHRONOS_validation";

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// Whether this host's CPU has AVX-512 DQ (a 64-bit multiply over eight 64-bit lanes in one instruction).
bool host_has_avx512dq() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

bool has_layer(const char* name) {
  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  return std::any_of(layers.begin(), layers.end(), [&](const VkLayerProperties& l) { return std::strcmp(l.layerName, name) == 0; });
}

bool has_instance_extension(const char* name) {
  uint32_t n = 0;
  vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data());
  return std::any_of(exts.begin(), exts.end(), [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
}

bool has_device_extension(VkPhysicalDevice pd, const char* name) {
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, exts.data());
  return std::any_of(exts.begin(), exts.end(), [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
}

VkInstance create_instance(bool validate, bool debug_utils) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "vkllm";
  app.applicationVersion = VK_MAKE_VERSION(0, 1, 0);
  app.pEngineName = "vkllm";
  app.apiVersion = VK_API_VERSION_1_2;
  std::vector<const char*> layers, exts;
  if (validate) layers.push_back(k_validation_layer);
  if (debug_utils) exts.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  ci.enabledLayerCount = static_cast<uint32_t>(layers.size());
  ci.ppEnabledLayerNames = layers.data();
  ci.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  ci.ppEnabledExtensionNames = exts.data();
  VkInstance inst = VK_NULL_HANDLE;
  const VkResult r = vkCreateInstance(&ci, nullptr, &inst);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED)
    throw Error(std::string("no Vulkan 1.2 driver found (vkCreateInstance: ") + vk_result_name(r) +
                "); install your GPU's Vulkan driver, or mesa-vulkan-drivers for the CPU driver lavapipe");
  VK_CHECK(r);
  return inst;
}

std::string device_type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
  }
}

DeviceInfo query_device(VkPhysicalDevice pd, uint32_t index) {
  DeviceInfo d;
  d.index = index;
  VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceVulkan11Properties p11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES};
  p11.pNext = &driver;
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &p11;
  vkGetPhysicalDeviceProperties2(pd, &props);
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  // (The push-descriptor limits only where the extension is there: a struct of a missing one is invalid.)
  VkPhysicalDevicePushDescriptorPropertiesKHR pushd{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR};
  d.push_descriptor = has_device_extension(pd, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  if (d.push_descriptor) m3.pNext = &pushd;
  VkPhysicalDeviceProperties2 props_m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props_m3.pNext = &m3;
  vkGetPhysicalDeviceProperties2(pd, &props_m3);

  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.pNext = &f12;
  // (Integer dot products' feature only where the extension is there, as above.)
  VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR idot{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
  if (has_device_extension(pd, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME)) f12.pNext = &idot;
  VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats.pNext = &f11;
  const uint32_t api = props.properties.apiVersion;
  if (api >= VK_API_VERSION_1_2) vkGetPhysicalDeviceFeatures2(pd, &feats);

  d.name = props.properties.deviceName;
  d.type = device_type_name(props.properties.deviceType);
  d.driver = std::string(driver.driverName) + (driver.driverInfo[0] ? std::string(" ") + driver.driverInfo : "");
  d.api_version = std::to_string(VK_API_VERSION_MAJOR(api)) + "." + std::to_string(VK_API_VERSION_MINOR(api)) + "." +
                  std::to_string(VK_API_VERSION_PATCH(api));
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(pd, &mem);
  for (uint32_t i = 0; i < mem.memoryHeapCount; ++i)
    d.heaps.emplace_back(mem.memoryHeaps[i].size, (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0);
  d.subgroup_size = p11.subgroupSize;
  d.subgroup_shuffle = (p11.subgroupSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                       (p11.subgroupSupportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
  d.fp16 = f12.shaderFloat16;
  d.int8 = f12.shaderInt8;
  d.int64 = feats.features.shaderInt64;
  // A CPU driver compiles shaders for this host: its vector instructions are the device's.
  d.wide_int64 = d.type == "cpu" && d.int64 && host_has_avx512dq();
  d.scalar_layout = f12.scalarBlockLayout;
  d.int_dot = idot.shaderIntegerDotProduct;
  d.storage16 = f11.storageBuffer16BitAccess;
  d.storage8 = f12.storageBuffer8BitAccess;
  d.max_push_descriptors = d.push_descriptor ? pushd.maxPushDescriptors : 0;
  d.binding_arrays = feats.features.shaderStorageBufferArrayDynamicIndexing;
  d.max_storage_buffer_range = props.properties.limits.maxStorageBufferRange;
  d.max_allocation_size = m3.maxMemoryAllocationSize;
  d.max_shared_memory = props.properties.limits.maxComputeSharedMemorySize;
  d.max_workgroup_invocations = props.properties.limits.maxComputeWorkGroupInvocations;

  std::vector<std::string> missing;
  if (api < VK_API_VERSION_1_2) missing.push_back("Vulkan 1.2 (device reports " + d.api_version + ")");
  if (!d.storage16) missing.push_back("storageBuffer16BitAccess");
  if (!d.storage8) missing.push_back("storageBuffer8BitAccess");
  if (!d.push_descriptor) missing.push_back(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  if (d.max_workgroup_invocations < 256) missing.push_back("256 invocations per workgroup");
  if (d.max_shared_memory < 16384) missing.push_back("16 KiB of shared memory");
  for (size_t i = 0; i < missing.size(); ++i) d.missing += (i ? ", " : "") + missing[i];
  return d;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance inst) {
  uint32_t n = 0;
  VK_CHECK(vkEnumeratePhysicalDevices(inst, &n, nullptr));
  std::vector<VkPhysicalDevice> pds(n);
  VK_CHECK(vkEnumeratePhysicalDevices(inst, &n, pds.data()));
  return pds;
}

}  // namespace

std::vector<DeviceInfo> list_devices() {
  VkInstance inst = create_instance(false, false);
  std::vector<DeviceInfo> out;
  const auto pds = physical_devices(inst);
  for (uint32_t i = 0; i < pds.size(); ++i) out.push_back(query_device(pds[i], i));
  vkDestroyInstance(inst, nullptr);
  return out;
}

VulkanContext::VulkanContext(const ContextOptions& o) {
  const bool validate = o.validate || env_flag("VKLLM_VALIDATE");
  if (validate && !has_layer(k_validation_layer))
    throw Error(std::string("validation was requested (VKLLM_VALIDATE) but ") + k_validation_layer +
                " is not installed (Debian: vulkan-validationlayers)");
  const bool debug_utils = has_instance_extension(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  instance_ = create_instance(validate, debug_utils);
  try {
    if (debug_utils) {
      set_name_ = reinterpret_cast<PFN_vkSetDebugUtilsObjectNameEXT>(vkGetInstanceProcAddr(instance_, "vkSetDebugUtilsObjectNameEXT"));
      if (validate) {
        auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
            vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
        VkDebugUtilsMessengerCreateInfoEXT ci{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
        ci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
        ci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
        ci.pfnUserCallback = &VulkanContext::on_debug_message;
        ci.pUserData = this;
        VK_CHECK(create(instance_, &ci, nullptr, &messenger_));
      }
    }

    const auto pds = physical_devices(instance_);
    if (pds.empty()) throw Error("no Vulkan device found (install a GPU driver, or mesa-vulkan-drivers for lavapipe)");
    std::vector<DeviceInfo> infos;
    for (uint32_t i = 0; i < pds.size(); ++i) infos.push_back(query_device(pds[i], i));
    uint32_t chosen = 0;
    if (o.device_index) {
      if (*o.device_index >= pds.size())
        throw Error("--device " + std::to_string(*o.device_index) + " does not exist: there are " + std::to_string(pds.size()) +
                    " Vulkan devices (see `vkllm devices`)");
      chosen = *o.device_index;
      if (!infos[chosen].missing.empty())
        throw Error("device " + std::to_string(chosen) + " (" + infos[chosen].name + ") lacks required features: " + infos[chosen].missing);
    } else {
      int best = -1;
      for (uint32_t i = 0; i < pds.size(); ++i) {
        if (!infos[i].missing.empty()) continue;
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        if (best < 0 || type_rank(p.deviceType) < best) {
          best = type_rank(p.deviceType);
          chosen = i;
        }
      }
      if (best < 0)
        throw Error("no usable Vulkan device: " + infos[0].name + " lacks required features: " + infos[0].missing);
    }
    physical_ = pds[chosen];
    info_ = infos[chosen];
    if (o.wide_int64) info_.wide_int64 = *o.wide_int64 && info_.int64;
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(physical_, &props);
    limits_ = props.limits;
    vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);

    // A queue family with compute; prefer one without graphics (async compute on discrete GPUs).
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qf(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, qf.data());
    int family = -1;
    for (uint32_t i = 0; i < nq; ++i) {
      if (!(qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
      if (family < 0 || !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) family = static_cast<int>(i);
    }
    if (family < 0) throw Error("device " + info_.name + " has no compute queue");
    queue_family_ = static_cast<uint32_t>(family);

    const float priority = 1.0f;
    VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = queue_family_;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    f12.storageBuffer8BitAccess = VK_TRUE;
    f12.shaderFloat16 = info_.fp16;
    f12.shaderInt8 = info_.int8;
    f12.scalarBlockLayout = info_.scalar_layout;
    VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
    f11.pNext = &f12;
    f11.storageBuffer16BitAccess = VK_TRUE;
    VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    feats.pNext = &f11;
    VkPhysicalDeviceFeatures supported;
    vkGetPhysicalDeviceFeatures(physical_, &supported);
    feats.features.shaderInt16 = supported.shaderInt16;
    feats.features.shaderInt64 = supported.shaderInt64;
    feats.features.shaderStorageBufferArrayDynamicIndexing = info_.binding_arrays;
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR idot{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
    idot.shaderIntegerDotProduct = VK_TRUE;
    std::vector<const char*> exts = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
    if (info_.int_dot) {
      f12.pNext = &idot;
      exts.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    }
    VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.pNext = &feats;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    dci.enabledExtensionCount = uint32_t(exts.size());
    dci.ppEnabledExtensionNames = exts.data();
    VK_CHECK(vkCreateDevice(physical_, &dci, nullptr, &device_));
    vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
    push_descriptor_ = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(vkGetDeviceProcAddr(device_, "vkCmdPushDescriptorSetKHR"));
    VKLLM_CHECK(push_descriptor_ != nullptr, "vkCmdPushDescriptorSetKHR missing on a device that lists the extension");
  } catch (...) {
    release();
    throw;
  }
}

VulkanContext::~VulkanContext() { release(); }

void VulkanContext::release() {
  for (auto& [buffer, views] : texel_views_)
    for (auto& [key, view] : views) vkDestroyBufferView(device_, view, nullptr);
  texel_views_.clear();
  if (device_) vkDestroyDevice(device_, nullptr);
  device_ = VK_NULL_HANDLE;
  if (messenger_) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
    messenger_ = VK_NULL_HANDLE;
  }
  if (instance_) vkDestroyInstance(instance_, nullptr);
  instance_ = VK_NULL_HANDLE;
}

VkBufferView VulkanContext::texel_view(VkBuffer buffer, uint64_t offset, uint64_t range, VkFormat format) const {
  VKLLM_CHECK(format == VK_FORMAT_R32G32B32A32_UINT || format == VK_FORMAT_R32_UINT, "texel views are r32ui or rgba32ui");
  const uint64_t texel = format == VK_FORMAT_R32_UINT ? 4 : 16;
  VKLLM_CHECK(offset % std::max<uint64_t>(limits_.minTexelBufferOffsetAlignment, 1) == 0,
              "texel view at offset " + std::to_string(offset) + " is not aligned to minTexelBufferOffsetAlignment");
  const uint64_t whole = range == 0 ? VK_WHOLE_SIZE : range / texel * texel;
  VKLLM_CHECK(whole != 0, "texel view of fewer bytes than one texel");
  VKLLM_CHECK(whole == VK_WHOLE_SIZE || whole / texel <= limits_.maxTexelBufferElements,
              "texel view of " + std::to_string(whole / texel) + " texels exceeds maxTexelBufferElements (" +
                  std::to_string(limits_.maxTexelBufferElements) + ")");
  std::lock_guard<std::mutex> lock(texel_mutex_);
  auto& views = texel_views_[buffer];
  // A view per bound range: callers bind stable ranges (a tensor, a layer's cache, a whole
  // scratch buffer), so the count stays small; this catches one that does not.
  VKLLM_CHECK(views.size() < 4096, "more than 4096 texel views of one buffer: a kernel binds a varying range as a texel buffer");
  VkBufferView& view = views[{offset, whole, format}];
  if (!view) {
    VkBufferViewCreateInfo ci{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
    ci.buffer = buffer;
    ci.format = format;
    ci.offset = offset;
    ci.range = whole;
    VK_CHECK(vkCreateBufferView(device_, &ci, nullptr, &view));
  }
  return view;
}

void VulkanContext::drop_texel_views(VkBuffer buffer) const {
  std::lock_guard<std::mutex> lock(texel_mutex_);
  auto it = texel_views_.find(buffer);
  if (it == texel_views_.end()) return;
  for (auto& [key, view] : it->second) vkDestroyBufferView(device_, view, nullptr);
  texel_views_.erase(it);
}

void VulkanContext::set_name(VkObjectType type, uint64_t handle, const std::string& name) const {
  if (!set_name_ || !device_) return;
  VkDebugUtilsObjectNameInfoEXT ni{VK_STRUCTURE_TYPE_DEBUG_UTILS_OBJECT_NAME_INFO_EXT};
  ni.objectType = type;
  ni.objectHandle = handle;
  ni.pObjectName = name.c_str();
  set_name_(device_, &ni);
}

VkBool32 VulkanContext::on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT, VkDebugUtilsMessageTypeFlagsEXT,
                                         const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  auto* self = static_cast<VulkanContext*>(user);
  std::lock_guard lock(self->messages_mutex_);
  self->messages_.emplace_back(data && data->pMessage ? data->pMessage : "(empty validation message)");
  return VK_FALSE;
}

}  // namespace vkllm
