// Per-token and per-layer KV byte counts.
#include "model/kv_layout.h"

#include <algorithm>

namespace vkllm {

uint64_t kv_bytes_per_token(const ModelConfig& c, CacheType k, CacheType v) {
  return uint64_t{c.n_layer} * (cache_row_bytes(k, c.n_embd_kv()) + cache_row_bytes(v, c.n_embd_kv()));
}

uint32_t window_ring_slots(const ModelConfig& c, uint32_t capacity, uint32_t n_ubatch) {
  if (!c.has_swa()) return 0;
  const uint64_t slots = uint64_t{c.n_swa} + n_ubatch;
  return slots < capacity ? static_cast<uint32_t>(slots) : 0;
}

uint32_t kv_layer_slots(const ModelConfig& c, uint32_t layer, uint32_t capacity, uint32_t ring) {
  return ring && c.is_swa(layer) ? ring : capacity;
}

uint64_t kv_cache_bytes(const ModelConfig& c, CacheType k, CacheType v, uint32_t capacity, uint32_t ring, uint32_t n_tokens) {
  const uint64_t row = cache_row_bytes(k, c.n_embd_kv()) + cache_row_bytes(v, c.n_embd_kv());
  uint64_t total = 0;
  for (uint32_t l = 0; l < c.n_layer; ++l) total += uint64_t{std::min(n_tokens, kv_layer_slots(c, l, capacity, ring))} * row;
  return total;
}

}  // namespace vkllm
