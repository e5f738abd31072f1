// Compute pipelines built from the embedded SPIR-V, and the VkPipelineCache persisted on disk.
#pragma once
#include <vulkan/vulkan.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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

// What Pipelines::get makes a pipeline from (Pipeline's constructor arguments).
struct PipelineSpec {
  std::string shader;
  uint32_t n_buffers = 0;
  uint32_t push_size = 0;
  std::vector<uint32_t> spec;
  std::string key() const;  // "shader:spec0:spec1…", what Pipelines keys a pipeline by
};

// Owns every pipeline the process creates, keyed by shader and specialization constants, and a
// VkPipelineCache loaded from and saved to `cache_path` (empty: not persisted). get, prepare, made
// and wait_prepared may be called from any thread; a Pipeline's submitted() flag and the first-use
// report belong to the thread that records.
class Pipelines {
 public:
  Pipelines(const VulkanContext& ctx, std::string cache_path);
  ~Pipelines();  // stops the preparing threads, then saves the cache (atomically) when it has a path

  // The pipeline, made on first request (or by prepare()): a request for one that a preparing
  // thread is making waits for it; one still queued is made by the caller at once. A failure to make
  // one is thrown to the requests waiting for it; the next request tries again.
  const Pipeline& get(const PipelineSpec& s);
  const Pipeline& get(const std::string& shader, uint32_t n_buffers, uint32_t push_size, const std::vector<uint32_t>& spec) {
    return get(PipelineSpec{shader, n_buffers, push_size, spec});
  }
  // Starts making `specs` (those not made or queued yet) on background threads, one per CPU, in the
  // order given: a CPU driver spends seconds in vkCreateComputePipelines on each large kernel, one
  // after another on the recording thread unless made ahead (docs/performance.md, "Start-up").
  void prepare(const std::vector<PipelineSpec>& specs);
  // Returns once every prepared pipeline is made (a benchmark measures nothing beside them).
  void wait_prepared();
  // The keys (PipelineSpec::key) of the pipelines made so far, sorted.
  std::vector<std::string> made() const;
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
  struct Entry {
    enum class State { Queued, Making, Done } state = State::Making;
    std::unique_ptr<Pipeline> pipeline;
    std::exception_ptr error;
  };
  // Makes `e` from `s` outside the lock and publishes it (or its error) under it.
  void make(Entry& e, const PipelineSpec& s);
  void prepare_worker();

  std::string cache_path_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  mutable std::mutex mu_;
  std::condition_variable made_;
  std::map<std::string, Entry> pipelines_;  // node-based: an Entry stays put while others are added
  std::deque<std::pair<Entry*, PipelineSpec>> queue_;  // prepare()'s in order (an entry get() took is skipped)
  std::vector<std::thread> workers_;  // joined by the destructor
  size_t active_workers_ = 0;         // those still taking from queue_
  bool stopping_ = false;
  FirstUseWait first_use_wait_;
  std::chrono::milliseconds first_use_after_{1000};
};

}  // namespace vkllm
