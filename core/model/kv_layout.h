// The bytes one token costs in the KV cache, across all layers.
#pragma once
#include <cstdint>

#include "kernels/cache_type.h"
#include "model/config.h"

namespace vkllm {

// Bytes of K plus V for one token across all layers.
uint64_t kv_bytes_per_token(const ModelConfig& c, CacheType k, CacheType v);

}  // namespace vkllm
