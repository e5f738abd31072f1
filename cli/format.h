// Number formatting for people: "1,234", "1.5 MiB".
#pragma once
#include <cstdint>
#include <string>

#include "base/commas.h"  // with_commas: 1234567 → "1,234,567"

namespace vkllm::cli {

std::string count_of(uint64_t n, const std::string& noun);  // "1 token", "1,234 tokens" (noun + "s")
std::string human_bytes(uint64_t n);   // 1536 → "1.5 KiB"; < 1 KiB → "640 B"
std::string human_count(uint64_t n);   // 1100000000 → "1.1B", 260000 → "260K"

}  // namespace vkllm::cli
