// A count written for people, with thousands separated: 1234567 → "1,234,567".
#pragma once
#include <cstdint>
#include <string>

namespace vkllm {

std::string with_commas(uint64_t n);

}  // namespace vkllm
