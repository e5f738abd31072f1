// The shared Vulkan context of a test executable.
#include "vk_test_env.h"

#include <memory>

namespace vkllm::test {
namespace {
std::unique_ptr<VulkanContext> g_ctx;
std::unique_ptr<Pipelines> g_pipelines;
size_t g_seen_messages = 0;

// Destroys the context when the tests are done, before main returns: destroyed by a static
// destructor instead, after the driver's own exit handlers, it crashed every test program at exit
// on NVIDIA's driver (580, an H200) once all its tests had passed.
class ContextTeardown : public ::testing::Environment {
 public:
  void TearDown() override {
    g_pipelines.reset();
    g_ctx.reset();
    g_seen_messages = 0;
  }
};
[[maybe_unused]] const ::testing::Environment* const g_teardown = ::testing::AddGlobalTestEnvironment(new ContextTeardown);
}  // namespace

VulkanContext& vk() {
  if (!g_ctx) g_ctx = std::make_unique<VulkanContext>();
  return *g_ctx;
}

Pipelines& pipelines() {
  if (!g_pipelines) g_pipelines = std::make_unique<Pipelines>(vk(), "");
  return *g_pipelines;
}

void expect_no_validation_messages() {
  if (!g_ctx) return;
  const auto& msgs = g_ctx->validation_messages();
  for (size_t i = g_seen_messages; i < msgs.size(); ++i) ADD_FAILURE() << "Vulkan validation: " << msgs[i];
  g_seen_messages = msgs.size();
}

}  // namespace vkllm::test
