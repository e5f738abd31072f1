// Command buffer recording and submission.
#include "vk/commands.h"

#include <algorithm>
#include <chrono>

namespace vkllm {

CommandRecorder::CommandRecorder(const VulkanContext& ctx, Pipelines* pipelines, uint32_t max_timestamps)
    : ctx_(ctx), pipelines_(pipelines), max_timestamps_(max_timestamps) {
  VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = ctx.queue_family();
  VK_CHECK(vkCreateCommandPool(ctx.device(), &pci, nullptr, &pool_));
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool_;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VK_CHECK(vkAllocateCommandBuffers(ctx.device(), &ai, &cmd_));
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  VK_CHECK(vkCreateFence(ctx.device(), &fci, nullptr, &fence_));
  if (max_timestamps_ > 0 && ctx.limits().timestampComputeAndGraphics) {
    VkQueryPoolCreateInfo qci{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qci.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qci.queryCount = max_timestamps_ * 2;
    VK_CHECK(vkCreateQueryPool(ctx.device(), &qci, nullptr, &queries_));
  }
}

CommandRecorder::~CommandRecorder() {
  VkDevice d = ctx_.device();
  if (queries_) vkDestroyQueryPool(d, queries_, nullptr);
  vkDestroyFence(d, fence_, nullptr);
  vkDestroyCommandPool(d, pool_, nullptr);
}

void CommandRecorder::begin_if_needed() {
  if (recording_) return;
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  VK_CHECK(vkBeginCommandBuffer(cmd_, &bi));
  if (queries_) vkCmdResetQueryPool(cmd_, queries_, 0, max_timestamps_ * 2);
  labels_.clear();
  recording_ = true;
}

void CommandRecorder::dispatch_raw(const Pipeline& p, std::span<const BufferView> buffers, const void* params,
                                   uint32_t params_size, uint32_t groups_x, uint32_t groups_y, uint32_t groups_z) {
  VKLLM_CHECK(buffers.size() == p.n_views(), p.name() + ": " + std::to_string(buffers.size()) + " buffers bound, pipeline has " +
                                                 std::to_string(p.n_views()));
  VKLLM_CHECK(params_size == p.push_size(), p.name() + ": push constant size mismatch");
  ++n_dispatches_;
  VKLLM_CHECK(groups_x <= ctx_.limits().maxComputeWorkGroupCount[0] && groups_y <= ctx_.limits().maxComputeWorkGroupCount[1] &&
                  groups_z <= ctx_.limits().maxComputeWorkGroupCount[2],
              p.name() + ": too many workgroups");
  if (groups_x == 0 || groups_y == 0 || groups_z == 0) return;
  begin_if_needed();
  // The views fill the bindings in order, an array binding taking as many as it holds.
  constexpr size_t kMaxViews = 32;
  VKLLM_CHECK(buffers.size() <= kMaxViews, "too many bindings");
  VkDescriptorBufferInfo infos[kMaxViews];
  VkBufferView texels[kMaxViews];
  VkWriteDescriptorSet writes[kMaxViews];
  auto view = buffers.begin();
  uint32_t at = 0;
  for (uint32_t i = 0; i < p.n_buffers(); ++i) {
    const BindingShape& shape = p.binding(i);
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstBinding = i;
    writes[i].descriptorCount = shape.count;
    if (shape.format != VK_FORMAT_UNDEFINED) {
      writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER;
      writes[i].pTexelBufferView = &texels[at];
    } else {
      writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      writes[i].pBufferInfo = &infos[at];
    }
    for (uint32_t k = 0; k < shape.count; ++k, ++at, ++view) {
      const BufferView& b = *view;
      if (shape.format != VK_FORMAT_UNDEFINED) {
        texels[at] = ctx_.texel_view(b.buffer, b.offset, b.range, shape.format);
      } else {
        VKLLM_CHECK(b.range <= ctx_.max_storage_range(), p.name() + ": binding " + std::to_string(i) + " range " +
                                                             std::to_string(b.range) + " exceeds maxStorageBufferRange");
        infos[at] = {b.buffer, b.offset, b.range ? b.range : VK_WHOLE_SIZE};
      }
    }
  }
  if (!p.submitted() && std::find(first_use_.begin(), first_use_.end(), &p) == first_use_.end()) first_use_.push_back(&p);
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p.handle());
  ctx_.push_descriptor_fn()(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout(), 0, p.n_buffers(), writes);
  if (params_size) vkCmdPushConstants(cmd_, p.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, params_size, params);
  const bool timed = queries_ && labels_.size() < max_timestamps_;
  if (timed) vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries_, uint32_t(labels_.size() * 2));
  vkCmdDispatch(cmd_, groups_x, groups_y, groups_z);
  if (timed) {
    vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, uint32_t(labels_.size() * 2 + 1));
    labels_.push_back(p.name());
  }
  ++n_commands_;
}

void CommandRecorder::barrier() {
  begin_if_needed();
  ++n_barriers_;
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(cmd_, stages, stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

void CommandRecorder::copy(const BufferView& src, const BufferView& dst) {
  VKLLM_CHECK(src.range == dst.range, "copy of unequal ranges");
  if (src.range == 0) return;
  begin_if_needed();
  VkBufferCopy region{src.offset, dst.offset, src.range};
  vkCmdCopyBuffer(cmd_, src.buffer, dst.buffer, 1, &region);
  ++n_commands_;
}

void CommandRecorder::fill_zero(const BufferView& dst) {
  if (dst.range == 0) return;
  begin_if_needed();
  vkCmdFillBuffer(cmd_, dst.buffer, dst.offset, dst.range, 0);
  ++n_commands_;
}

// Waits for the submitted recording. One that runs pipelines for the first time may wait for their
// compiles (CPU drivers compile at first run): its wait is reported, once it has taken long enough.
void CommandRecorder::wait_for_fence() {
  const std::vector<const Pipeline*> first = std::move(first_use_);
  first_use_.clear();
  const Pipelines::FirstUseWait* report = pipelines_ && !first.empty() && pipelines_->first_use_wait() ? &pipelines_->first_use_wait() : nullptr;
  if (!report) {
    VK_CHECK(vkWaitForFences(ctx_.device(), 1, &fence_, VK_TRUE, UINT64_MAX));
  } else {
    const auto start = std::chrono::steady_clock::now();
    const uint64_t poll_ns = uint64_t(std::clamp<int64_t>(pipelines_->first_use_after().count(), 1, 250)) * 1'000'000;
    bool reported = false;
    for (;;) {
      const VkResult r = vkWaitForFences(ctx_.device(), 1, &fence_, VK_TRUE, poll_ns);
      if (r == VK_SUCCESS) break;
      if (r != VK_TIMEOUT) VK_CHECK(r);
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= pipelines_->first_use_after()) {
        (*report)(std::chrono::duration<double>(waited).count());
        reported = true;
      }
    }
    if (reported) (*report)(-1);
  }
  for (const Pipeline* p : first) p->mark_submitted();
}

BufferView CommandRecorder::scratch(uint64_t bytes) {
  const uint64_t size = (bytes + 255) / 256 * 256;
  if (scratch_.empty() || scratch_used_ + size > scratch_.back()->size()) {
    const uint64_t have = scratch_.empty() ? 0 : scratch_.back()->size();
    scratch_.push_back(std::make_unique<Buffer>(ctx_, std::max({size, 2 * have, uint64_t{1} << 20}), MemoryUse::Device,
                                                "recorder scratch"));
    scratch_used_ = 0;
  }
  const BufferView v = scratch_.back()->view(scratch_used_, bytes);
  scratch_used_ += size;
  return v;
}

void CommandRecorder::submit_and_wait() {
  timings_.clear();
  if (!recording_) return;
  VK_CHECK(vkEndCommandBuffer(cmd_));
  recording_ = false;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  VK_CHECK(vkQueueSubmit(ctx_.queue(), 1, &si, fence_));
  wait_for_fence();
  VK_CHECK(vkResetFences(ctx_.device(), 1, &fence_));
  VK_CHECK(vkResetCommandBuffer(cmd_, 0));
  n_commands_ = 0;
  if (scratch_.size() > 1) scratch_.erase(scratch_.begin(), scratch_.end() - 1);
  scratch_used_ = 0;
  if (queries_ && !labels_.empty()) {
    std::vector<uint64_t> ts(labels_.size() * 2);
    VK_CHECK(vkGetQueryPoolResults(ctx_.device(), queries_, 0, uint32_t(ts.size()), ts.size() * 8, ts.data(), 8,
                                   VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
    for (size_t i = 0; i < labels_.size(); ++i)
      timings_.push_back({labels_[i], double(ts[2 * i + 1] - ts[2 * i]) * ctx_.timestamp_period_ns() * 1e-6});
  }
}

}  // namespace vkllm
