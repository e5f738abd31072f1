// Per-token KV byte counts.
#include "model/kv_layout.h"

namespace vkllm {

uint64_t kv_bytes_per_token(const ModelConfig& c, CacheType k, CacheType v) {
  return uint64_t{c.n_layer} * (cache_row_bytes(k, c.n_embd_kv()) + cache_row_bytes(v, c.n_embd_kv()));
}

}  // namespace vkllm
