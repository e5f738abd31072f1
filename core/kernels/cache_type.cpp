// KV cache row element types.
#include "kernels/cache_type.h"

namespace vkllm {

const char* cache_type_name(CacheType t) {
  switch (t) {
    case CacheType::F16: return "f16";
    case CacheType::Q8_0: return "q8_0";
    case CacheType::Q4_0: return "q4_0";
  }
  return "?";
}

std::optional<CacheType> cache_type_from_name(std::string_view s) {
  if (s == "f16") return CacheType::F16;
  if (s == "q8_0") return CacheType::Q8_0;
  if (s == "q4_0") return CacheType::Q4_0;
  return std::nullopt;
}

uint64_t cache_row_bytes(CacheType t, uint64_t n) {
  switch (t) {
    case CacheType::F16: return n * 2;
    case CacheType::Q8_0: return n / 32 * 34;  // f16 scale + 32 × i8
    case CacheType::Q4_0: return n / 32 * 18;  // f16 scale + 32 × 4 bits
  }
  return 0;
}

bool cache_type_fits(CacheType t, uint64_t n) { return t == CacheType::F16 || n % 32 == 0; }

std::string cache_type_misfit(uint64_t n) { return "needs a KV row width that is a multiple of 32; this model's is " + std::to_string(n); }

}  // namespace vkllm
