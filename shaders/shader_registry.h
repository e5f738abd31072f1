// The embedded SPIR-V modules, compiled from shaders/*.comp at build time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace vkllm::shaders {

struct Module {
  const char* name;      // variant name, e.g. "matvec_q4_0"
  const uint32_t* code;  // SPIR-V words
  size_t n_words;
};

std::span<const Module> all();
// The module named `name`, or nullptr.
const Module* find(std::string_view name);

}  // namespace vkllm::shaders
