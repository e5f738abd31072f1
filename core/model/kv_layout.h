// The bytes one token costs in the KV cache, and the slots each layer keeps.
#pragma once
#include <cstdint>

#include "kernels/cache_type.h"
#include "model/config.h"

namespace vkllm {

// Bytes of K plus V for one token across all layers (every layer holding it).
uint64_t kv_bytes_per_token(const ModelConfig& c, CacheType k, CacheType v);

// Slots of a sliding-window layer's own ring: its window plus one prefill chunk (a chunk's first
// query still sees the window before it), or 0 when that is not fewer than the cache's capacity
// (the window layers then share the global layers' slots). See docs/kv-cache.md.
uint32_t window_ring_slots(const ModelConfig& c, uint32_t capacity, uint32_t n_ubatch);

// Slots layer l keeps for a cache of `capacity` tokens whose window layers have rings of `ring`
// slots (0: none, they keep `capacity` like the others).
uint32_t kv_layer_slots(const ModelConfig& c, uint32_t layer, uint32_t capacity, uint32_t ring);

// Bytes the cache's rows take when it holds n_tokens (n_tokens = capacity: the whole allocation):
// the sum over layers of min(n_tokens, the layer's slots) × (K + V row bytes).
uint64_t kv_cache_bytes(const ModelConfig& c, CacheType k, CacheType v, uint32_t capacity, uint32_t ring, uint32_t n_tokens);
inline uint64_t kv_cache_bytes(const ModelConfig& c, CacheType k, CacheType v, uint32_t capacity, uint32_t ring) {
  return kv_cache_bytes(c, k, v, capacity, ring, capacity);
}

}  // namespace vkllm
