// One Vulkan context and pipeline set per test executable, created on first use, and the check
// that the validation layers (VKLLM_VALIDATE=1 under ctest) reported nothing.
#pragma once
#include <gtest/gtest.h>

#include "vk/context.h"
#include "vk/pipeline.h"

namespace vkllm::test {

VulkanContext& vk();
Pipelines& pipelines();
// Fails the current test if the validation layers reported anything since the last call.
void expect_no_validation_messages();

// Base fixture for device tests: checks validation messages after every test.
class VulkanTest : public ::testing::Test {
 protected:
  void TearDown() override { expect_no_validation_messages(); }
};

}  // namespace vkllm::test
