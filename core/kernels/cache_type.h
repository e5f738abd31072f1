// KV cache row element types: how one token's K or V row is stored, and its size in bytes.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace vkllm {

// How K and V rows are stored in the cache. Quantized types use ggml's q8_0 / q4_0 blocks of 32
// elements along a token's row of n_head_kv * head_dim values.
enum class CacheType { F16, Q8_0, Q4_0 };

const char* cache_type_name(CacheType t);                   // "f16", "q8_0", "q4_0"
std::optional<CacheType> cache_type_from_name(std::string_view s);
// Bytes of one row of `n` elements (n a multiple of 32 for quantized types).
uint64_t cache_row_bytes(CacheType t, uint64_t n);
// Whether a row of `n` elements can be stored in `t` (quantized types need n % 32 == 0).
bool cache_type_fits(CacheType t, uint64_t n);
// Every type, in the order tables list them.
inline constexpr CacheType k_cache_types[] = {CacheType::F16, CacheType::Q8_0, CacheType::Q4_0};
// Why a quantized type does not fit a KV row of n values: "needs a KV row width that is a multiple
// of 32; this model's is n" (every refusal of it says the same).
std::string cache_type_misfit(uint64_t n);

}  // namespace vkllm
