// Helpers for the shader op tests: random data, device buffers from host vectors, and the
// normalised mean squared error that llama.cpp's test-backend-ops compares with.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "vk/buffer.h"
#include "vk_test_env.h"

namespace vkllm::test {

// sum((a-b)²) / sum(b²), with b the reference.
double nmse(const std::vector<float>& a, const std::vector<float>& b);

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// A device buffer of `ctx` holding `data` (on the test context vk() without one).
template <typename T>
Buffer to_device(VulkanContext& ctx, const std::vector<T>& data, const char* name = "test input") {
  Buffer b(ctx, std::max<size_t>(data.size() * sizeof(T), 16), MemoryUse::Device, name);
  if (!data.empty()) upload(ctx, b, 0, data.data(), data.size() * sizeof(T));
  return b;
}
template <typename T>
Buffer to_device(const std::vector<T>& data, const char* name = "test input") {
  return to_device(vk(), data, name);
}

template <typename T>
std::vector<T> from_device(VulkanContext& ctx, const Buffer& b, size_t n) {
  std::vector<T> out(n);
  download(ctx, b, 0, out.data(), n * sizeof(T));
  return out;
}
template <typename T>
std::vector<T> from_device(const Buffer& b, size_t n) {
  return from_device<T>(vk(), b, n);
}

}  // namespace vkllm::test
