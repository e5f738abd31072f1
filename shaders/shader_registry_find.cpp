// Lookup of an embedded SPIR-V module by variant name.
#include "shader_registry.h"

namespace vkllm::shaders {

const Module* find(std::string_view name) {
  for (const Module& m : all())
    if (name == m.name) return &m;
  return nullptr;
}

}  // namespace vkllm::shaders
