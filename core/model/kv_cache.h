// KvCache: the ring-buffered KV cache in device memory and the CPU-side map of which token sits
// in which slot. Design in docs/kv-cache.md.
//
// The cache holds a *logical sequence* of tokens: the pinned tokens (the first n_keep, never
// evicted) followed by the window (the most recent tokens, oldest first). Logical index i is also
// the token's RoPE position (StreamingLLM): positions are assigned within the cache, so after the
// ring wraps the sinks keep positions 0…n_keep−1 and the window stays contiguous after them. K is
// stored un-rotated and attention rotates it at the position read from kv_pos, so re-assigning
// positions moves no data.
//
// Slots: pinned token i lives in slot i; the window occupies slots n_keep … capacity−1 as a ring
// whose oldest entry is at `head_`. Appending to a full cache overwrites the oldest window slot.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/kv_layout.h"
#include "model/config.h"
#include "vk/buffer.h"

namespace vkllm {

struct KvCacheOptions {
  uint32_t capacity = 4096;        // slots (--ctx)
  CacheType type_k = CacheType::F16;
  CacheType type_v = CacheType::F16;
};

class KvCache {
 public:
  KvCache(const VulkanContext& ctx, const ModelConfig& config, const KvCacheOptions& o);

  // Where the next `n` tokens go, in order; appends them to the logical sequence, evicting the
  // oldest window tokens when full. Returns the slots; `positions` receives their positions.
  std::vector<int32_t> append(std::span<const int32_t> tokens, std::vector<int32_t>& positions);
  // The whole logical sequence as attention reads it: slot and position of every live token.
  void attention_lists(std::vector<int32_t>& slots, std::vector<int32_t>& positions) const;
  // Keeps the first n logical tokens (n ≤ used()). Pinned tokens beyond n are unpinned.
  void truncate(uint32_t n);
  void clear() { truncate(0); }
  // Pins the first n logical tokens (n ≤ capacity − 1): they are never evicted.
  void set_keep(uint32_t n);

  uint32_t capacity() const { return capacity_; }
  uint32_t used() const { return n_pinned_ + n_window_; }
  uint32_t keep() const { return n_keep_; }
  uint64_t evicted() const { return n_evicted_; }   // tokens overwritten since the last clear
  const std::vector<int32_t>& tokens() const { return tokens_; }  // logical sequence
  CacheType type_k() const { return type_k_; }
  CacheType type_v() const { return type_v_; }
  uint64_t bytes_per_token() const { return bytes_per_token_; }
  uint64_t bytes_used() const { return bytes_per_token_ * used(); }
  uint64_t device_bytes() const;                    // allocated: capacity × bytes per token (+ alignment)
  uint64_t row_bytes_k() const { return row_bytes_k_; }
  uint64_t row_bytes_v() const { return row_bytes_v_; }

  // Layer l's K or V rows: [capacity][row bytes] in the cache type.
  const Buffer& k(uint32_t layer) const { return k_[layer]; }
  const Buffer& v(uint32_t layer) const { return v_[layer]; }
  // Slot of logical index i.
  int32_t slot_of(uint32_t i) const;

  // Session files and the prompt cache (core/store/session_file.h) move rows in the *session layout*:
  // for each layer, K rows [n][row_bytes_k] then V rows [n][row_bytes_v], tokens in logical
  // order. read_rows copies the first n logical tokens (n ≤ used()) out of the device.
  std::vector<uint8_t> read_rows(uint32_t n) const;
  // Replaces the whole cache: `tokens` become the logical sequence at slots 0…n−1 (logical i in
  // slot i, i.e. an unwrapped ring), the first min(n, n_keep) of them pinned, `rows` (session
  // layout, n tokens) uploaded. The caller has validated sizes: a mismatch is a bug.
  void restore(std::span<const int32_t> tokens, uint32_t n_keep, uint64_t n_evicted, std::span<const uint8_t> rows);

 private:
  const VulkanContext* ctx_;
  uint32_t capacity_;
  CacheType type_k_, type_v_;
  uint64_t row_bytes_k_, row_bytes_v_, bytes_per_token_;
  std::vector<Buffer> k_, v_;
  uint32_t n_keep_ = 0;    // pinned target: the first n_keep logical tokens
  uint32_t n_pinned_ = 0;  // pinned tokens present (≤ n_keep)
  uint32_t n_window_ = 0;  // window tokens present
  uint32_t head_ = 0;      // window ring index of the oldest window token
  uint64_t n_evicted_ = 0;
  std::vector<int32_t> tokens_;  // logical sequence: pinned then window, oldest first
};

}  // namespace vkllm
