// The Vulkan runtime: device selection, buffers, an embedded shader dispatched on the device,
// uploads/downloads through staging, and a clean validation log.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/params.h"
#include "shader_registry.h"
#include "vk/buffer.h"
#include "vk/commands.h"
#include "vk/pipeline.h"
#include "vk_test_env.h"

using namespace vkllm;
using vkllm::test::VulkanTest;

TEST_F(VulkanTest, DeviceReportsRealLimits) {
  const DeviceInfo& d = test::vk().info();
  EXPECT_TRUE(d.missing.empty()) << d.missing;
  EXPECT_GT(d.subgroup_size, 0u);
  EXPECT_GE(d.max_storage_buffer_range, 1u << 20);
  EXPECT_FALSE(d.heaps.empty());
  EXPECT_FALSE(list_devices().empty());
}

TEST_F(VulkanTest, EmbeddedShadersArePresent) {
  ASSERT_NE(shaders::find("fill_f32"), nullptr);
  EXPECT_EQ(shaders::find("fill_f32")->code[0], 0x07230203u);  // SPIR-V magic
  EXPECT_EQ(shaders::find("no_such_shader"), nullptr);
}

TEST_F(VulkanTest, FillShaderWritesEveryElementAndNoMore) {
  VulkanContext& ctx = test::vk();
  for (uint32_t n : {1u, 63u, 64u, 1000u, 65537u}) {
    Buffer buf(ctx, (n + 16) * sizeof(float), MemoryUse::Device, "fill test");
    std::vector<float> init(n + 16, -1.0f);
    upload(ctx, buf, 0, init.data(), init.size() * 4);
    const Pipeline& p = test::pipelines().get("fill_f32", 1, sizeof(FillParams), {64});
    CommandRecorder rec(ctx);
    rec.dispatch(p, {buf.view()}, FillParams{n, 2.5f}, div_ceil(n, 64));
    rec.submit_and_wait();
    std::vector<float> out(n + 16);
    download(ctx, buf, 0, out.data(), out.size() * 4);
    for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.5f) << "n=" << n << " i=" << i;
    for (uint32_t i = n; i < n + 16; ++i) ASSERT_EQ(out[i], -1.0f) << "n=" << n << " i=" << i;
  }
}

// Pipelines made ahead on background threads (Pipelines::prepare, what a model load starts): every
// thread that asks for one gets the same pipeline, made once; one that cannot be made throws its
// error to whoever asks for it (and only then), and is tried again at the next request; a prepared
// pipeline dispatches like any other; and the set can be destroyed with work still queued.
TEST_F(VulkanTest, PreparedPipelinesAreMadeOnceAndShared) {
  VulkanContext& ctx = test::vk();
  std::vector<PipelineSpec> specs;
  for (uint32_t wg : {64u, 32u, 128u, 16u}) specs.push_back({"fill_f32", 1, sizeof(FillParams), {wg}});
  specs.push_back({"no_such_shader", 1, 4, {64}});
  {
    Pipelines pipes(ctx, "");
    pipes.prepare(specs);
    pipes.prepare(specs);  // a second request for the same ones queues nothing more
    std::vector<const Pipeline*> got(8, nullptr);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < got.size(); ++t)
      threads.emplace_back([&, t] { got[t] = &pipes.get(specs[t % 4]); });
    for (std::thread& t : threads) t.join();
    for (size_t t = 0; t < got.size(); ++t) {
      EXPECT_EQ(got[t], got[t % 4]) << "thread " << t;
      EXPECT_EQ(got[t]->workgroup_size(), specs[t % 4].spec[0]);
    }
    EXPECT_THROW(
        try { pipes.get(specs[4]); } catch (const std::logic_error& e) {
          EXPECT_NE(std::string(e.what()).find("no_such_shader"), std::string::npos) << e.what();
          throw;
        },
        std::logic_error);
    EXPECT_THROW(pipes.get(specs[4]), std::logic_error);  // tried again, failed again
    pipes.wait_prepared();
    EXPECT_EQ(pipes.made(), (std::vector<std::string>{"fill_f32:128", "fill_f32:16", "fill_f32:32", "fill_f32:64"}));

    const uint32_t n = 1000;
    Buffer buf(ctx, n * sizeof(float), MemoryUse::Device, "prepared fill");
    CommandRecorder rec(ctx, &pipes);
    rec.dispatch(pipes.get(specs[1]), {buf.view()}, FillParams{n, 7.0f}, div_ceil(n, 32));
    rec.submit_and_wait();
    std::vector<float> out(n);
    download(ctx, buf, 0, out.data(), out.size() * 4);
    EXPECT_EQ(out, std::vector<float>(n, 7.0f));
  }
  {
    Pipelines pipes(ctx, "");
    std::vector<PipelineSpec> many;
    for (uint32_t wg = 1; wg <= 256; wg *= 2) many.push_back({"fill_f32", 1, sizeof(FillParams), {wg}});
    pipes.prepare(many);
  }  // destroyed at once: the threads stop after the pipeline each is making
}

// The VmFlags line of the /proc/self/smaps entry that holds address `at` ("" when none).
static std::string smaps_flags_at(uintptr_t at) {
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST_F(VulkanTest, LargeDeviceBuffersOnACpuDriverAskForHugePages) {
  VulkanContext& ctx = test::vk();
  if (ctx.info().type != "cpu") GTEST_SKIP() << "device " << ctx.info().name << " is not a CPU driver";
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  if (!std::getline(thp, modes) || modes.find("[never]") != std::string::npos)
    GTEST_SKIP() << "/sys/kernel/mm/transparent_hugepage/enabled: transparent huge pages are off (" << modes << ")";
  const uint64_t size = 16u << 20;
  Buffer buf(ctx, size, MemoryUse::Device, "huge page test");
  ASSERT_TRUE(buf.host_visible());
  // The middle of the buffer lies in a whole 2 MiB page, inside the advised range.
  const std::string flags = smaps_flags_at(reinterpret_cast<uintptr_t>(buf.mapped()) + size / 2);
  ASSERT_FALSE(flags.empty()) << "no /proc/self/smaps entry holds the buffer";
  EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << flags;
  // The memory still works as memory.
  std::vector<uint32_t> in(size / 4), out(size / 4);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint32_t>(i * 2654435761u);
  upload(ctx, buf, 0, in.data(), size);
  download(ctx, buf, 0, out.data(), size);
  EXPECT_EQ(in, out);
}

TEST_F(VulkanTest, BindsASubrangeAtAnAlignedOffset) {
  VulkanContext& ctx = test::vk();
  const uint64_t align = ctx.limits().minStorageBufferOffsetAlignment;
  const uint64_t offset = align * 4;
  Buffer buf(ctx, offset + 256 * 4 + 64, MemoryUse::Upload, "subrange test");
  std::memset(buf.mapped(), 0, buf.size());
  const Pipeline& p = test::pipelines().get("fill_f32", 1, sizeof(FillParams), {32});
  CommandRecorder rec(ctx);
  rec.dispatch(p, {buf.view(offset, 256 * 4)}, FillParams{256, 7.0f}, div_ceil(256, 32));
  rec.submit_and_wait();
  const float* f = static_cast<const float*>(buf.mapped());
  EXPECT_EQ(f[offset / 4 - 1], 0.0f);
  EXPECT_EQ(f[offset / 4], 7.0f);
  EXPECT_EQ(f[offset / 4 + 255], 7.0f);
  EXPECT_EQ(f[offset / 4 + 256], 0.0f);
}

TEST_F(VulkanTest, RecorderIsReusableAndTimesDispatches) {
  VulkanContext& ctx = test::vk();
  Buffer buf(ctx, 4096, MemoryUse::Readback, "timing test");
  const Pipeline& p = test::pipelines().get("fill_f32", 1, sizeof(FillParams), {64});
  CommandRecorder rec(ctx, nullptr, 8);
  for (int step = 0; step < 3; ++step) {
    rec.dispatch(p, {buf.view()}, FillParams{1024, float(step)}, 16);
    rec.barrier();
    rec.dispatch(p, {buf.view()}, FillParams{512, float(step) + 0.5f}, 8);
    rec.submit_and_wait();
    const float* f = static_cast<const float*>(buf.mapped());
    EXPECT_EQ(f[0], float(step) + 0.5f);
    EXPECT_EQ(f[1000], float(step));
    if (ctx.limits().timestampComputeAndGraphics) {
      ASSERT_EQ(rec.timings().size(), 2u);
      EXPECT_EQ(rec.timings()[0].label, "fill_f32");
      EXPECT_GE(rec.timings()[0].ms, 0.0);
    }
  }
}

TEST_F(VulkanTest, BadDeviceIndexIsAClearError) {
  ContextOptions o;
  o.device_index = 99;
  try {
    VulkanContext bad(o);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device 99 does not exist"), std::string::npos) << e.what();
  }
}
