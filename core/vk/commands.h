// CommandRecorder: records dispatches, barriers and copies into one command buffer, submits it
// once and waits on a fence. A prefill chunk or a decode step is one recording.
#pragma once
#include <vulkan/vulkan.h>

#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "vk/buffer.h"
#include "vk/context.h"
#include "vk/pipeline.h"

namespace vkllm {

// GPU time of one labelled dispatch, from timestamps (profiling only).
struct DispatchTiming {
  std::string label;
  double ms = 0;
};

class CommandRecorder {
 public:
  // `max_timestamps` > 0 enables per-dispatch GPU timing (up to that many dispatches).
  // `pipelines` (may be null for transfer-only use) is where record_<op> functions get kernels.
  explicit CommandRecorder(const VulkanContext& ctx, Pipelines* pipelines = nullptr, uint32_t max_timestamps = 0);
  ~CommandRecorder();
  CommandRecorder(const CommandRecorder&) = delete;
  CommandRecorder& operator=(const CommandRecorder&) = delete;

  // Binds `buffers` to bindings 0..n-1 (an array binding of N takes the next N of them), pushes
  // `params` and dispatches `groups_*` workgroups.
  template <typename Params>
  void dispatch(const Pipeline& p, std::initializer_list<BufferView> buffers, const Params& params, uint32_t groups_x,
                uint32_t groups_y = 1, uint32_t groups_z = 1) {
    static_assert(sizeof(Params) % 4 == 0, "push constants are 4-byte fields");
    dispatch_raw(p, std::span<const BufferView>(buffers.begin(), buffers.size()), &params, sizeof(Params), groups_x, groups_y,
                 groups_z);
  }
  // The same with the views in a container (array bindings of a length set by the caller).
  template <typename Params>
  void dispatch_views(const Pipeline& p, std::span<const BufferView> buffers, const Params& params, uint32_t groups_x,
                      uint32_t groups_y = 1, uint32_t groups_z = 1) {
    static_assert(sizeof(Params) % 4 == 0, "push constants are 4-byte fields");
    dispatch_raw(p, buffers, &params, sizeof(Params), groups_x, groups_y, groups_z);
  }
  void dispatch_raw(const Pipeline& p, std::span<const BufferView> buffers, const void* params, uint32_t params_size,
                    uint32_t groups_x, uint32_t groups_y, uint32_t groups_z);
  // Makes every earlier shader/transfer write visible to every later shader/transfer access.
  void barrier();
  void copy(const BufferView& src, const BufferView& dst);
  // `bytes` of device memory for this recording alone (256-byte aligned): matvec's 8-bit copy of x.
  // Reused by the next recording once submit_and_wait returns.
  BufferView scratch(uint64_t bytes);
  void fill_zero(const BufferView& dst);
  // Ends, submits, waits; throws Error on device loss. Afterwards the recorder is empty and reusable.
  // A wait for pipelines run for the first time is reported to Pipelines::first_use_wait.
  void submit_and_wait();
  bool empty() const { return n_commands_ == 0; }
  const VulkanContext& context() const { return ctx_; }
  Pipelines& pipelines() const {
    VKLLM_CHECK(pipelines_ != nullptr, "this recorder was made for transfers only");
    return *pipelines_;
  }
  // Dispatches and barriers recorded since the recorder was made (for `bench`).
  uint64_t dispatches_recorded() const { return n_dispatches_; }
  uint64_t barriers_recorded() const { return n_barriers_; }
  // Timings of the last submitted recording (empty unless timing was enabled).
  const std::vector<DispatchTiming>& timings() const { return timings_; }

 private:
  void begin_if_needed();
  void wait_for_fence();
  const VulkanContext& ctx_;
  Pipelines* pipelines_ = nullptr;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  uint32_t max_timestamps_ = 0;
  std::vector<std::string> labels_;
  std::vector<DispatchTiming> timings_;
  bool recording_ = false;
  std::vector<const Pipeline*> first_use_;  // pipelines of this recording never submitted before
  uint32_t n_commands_ = 0;
  uint64_t n_dispatches_ = 0, n_barriers_ = 0;
  std::vector<std::unique_ptr<Buffer>> scratch_;  // the last one in use; earlier (smaller) ones freed after the submit
  uint64_t scratch_used_ = 0;
};

// Workgroups needed to cover `n` items with `per_group` items each.
inline uint32_t div_ceil(uint64_t n, uint64_t per_group) { return static_cast<uint32_t>((n + per_group - 1) / per_group); }

}  // namespace vkllm
