// Compute pipelines built from the embedded SPIR-V, and the VkPipelineCache persisted on disk.
#pragma once
#include <vulkan/vulkan.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "vk/context.h"

namespace vkllm {

// One binding of a pipeline: a storage texel buffer's format (UNDEFINED: a storage buffer) and how
// many descriptors it holds (an array binding: more than 1).
struct BindingShape {
  VkFormat format = VK_FORMAT_UNDEFINED;
  uint32_t count = 1;
};

// One compute pipeline: `n_buffers` buffer bindings 0..n-1 (push descriptors) and one
// push-constant struct of `push_size` bytes. A binding the shader declares as an r32ui or rgba32ui
// `uimageBuffer` is a storage texel buffer (found in the SPIR-V), every other one a storage
// buffer; one declared as an array of N holds N descriptors (the kernels that serve several
// sequences in one dispatch). Specialization constant 0 is the workgroup size x; the others are the
// kernel's own (documented in its .comp file).
class Pipeline {
 public:
  Pipeline(const VulkanContext& ctx, VkPipelineCache cache, const std::string& shader, uint32_t n_buffers,
           uint32_t push_size, const std::vector<uint32_t>& spec);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  VkPipeline handle() const { return pipeline_; }
  VkPipelineLayout layout() const { return layout_; }
  uint32_t n_buffers() const { return n_buffers_; }
  // Buffer views a dispatch binds: one per descriptor, binding by binding (n_buffers() without arrays).
  uint32_t n_views() const { return n_views_; }
  const BindingShape& binding(uint32_t i) const { return bindings_[i]; }
  uint32_t push_size() const { return push_size_; }
  uint32_t workgroup_size() const { return workgroup_size_; }
  const std::string& name() const { return name_; }
  // Whether a recording that dispatches it has been submitted: a CPU driver compiles a pipeline's
  // code when it first runs it (seconds each, on its queue thread), so that submit waits long.
  bool submitted() const { return submitted_; }
  void mark_submitted() const { submitted_ = true; }

 private:
  const VulkanContext& ctx_;
  std::string name_;
  uint32_t n_buffers_ = 0;
  uint32_t push_size_ = 0;
  uint32_t workgroup_size_ = 0;
  uint32_t n_views_ = 0;
  std::vector<BindingShape> bindings_;
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
  mutable bool submitted_ = false;
};

// Owns every pipeline the process creates, keyed by shader and specialization constants, and a
// VkPipelineCache loaded from and saved to `cache_path` (empty: not persisted).
class Pipelines {
 public:
  Pipelines(const VulkanContext& ctx, std::string cache_path);
  ~Pipelines();  // saves the cache (atomically) when it has a path

  const Pipeline& get(const std::string& shader, uint32_t n_buffers, uint32_t push_size, const std::vector<uint32_t>& spec);
  const VulkanContext& context() const { return ctx_; }

  // Told about a submit that runs pipelines for the first time and has waited at least `after`:
  // every quarter second (or `after`, if shorter) with the seconds waited so far, then once with -1
  // when it is done (a status line for the first run on a device; CommandRecorder::submit_and_wait).
  using FirstUseWait = std::function<void(double)>;
  void set_first_use_wait(FirstUseWait fn, std::chrono::milliseconds after = std::chrono::milliseconds(1000)) {
    first_use_wait_ = std::move(fn);
    first_use_after_ = after;
  }
  const FirstUseWait& first_use_wait() const { return first_use_wait_; }
  std::chrono::milliseconds first_use_after() const { return first_use_after_; }

 private:
  const VulkanContext& ctx_;
  std::string cache_path_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::map<std::string, std::unique_ptr<Pipeline>> pipelines_;
  FirstUseWait first_use_wait_;
  std::chrono::milliseconds first_use_after_{1000};
};

// $XDG_CACHE_HOME/vkllm (or ~/.cache/vkllm): where the pipeline cache lives; "" when unknown.
std::string default_cache_dir();

}  // namespace vkllm
