// Ring-buffer bookkeeping of the KV cache and its device allocation.
#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "vk/commands.h"

namespace vkllm {

KvCache::KvCache(const VulkanContext& ctx, const ModelConfig& config, const KvCacheOptions& o)
    : ctx_(&ctx), capacity_(o.capacity), type_k_(o.type_k), type_v_(o.type_v) {
  const uint32_t row = config.n_embd_kv();
  for (CacheType t : {type_k_, type_v_})
    if (!cache_type_fits(t, row))
      throw Error(std::string("--cache-type ") + cache_type_name(t) + " needs a KV row width that is a multiple of 32; this model's is " +
                  std::to_string(row));
  if (capacity_ < 2) throw Error("--ctx " + std::to_string(capacity_) + " is too small (at least 2 tokens)");
  row_bytes_k_ = cache_row_bytes(type_k_, row);
  row_bytes_v_ = cache_row_bytes(type_v_, row);
  bytes_per_token_ = kv_bytes_per_token(config, type_k_, type_v_);
  const uint64_t range = ctx.max_storage_range();
  if (uint64_t{capacity_} * std::max(row_bytes_k_, row_bytes_v_) > range)
    throw Error("--ctx " + std::to_string(capacity_) + " needs " + std::to_string(capacity_ * std::max(row_bytes_k_, row_bytes_v_)) +
                " bytes per layer, more than one binding of " + ctx.info().name + " can hold (" + std::to_string(range) +
                "); use --ctx " + std::to_string(range / std::max(row_bytes_k_, row_bytes_v_)) + " or a quantized --cache-type");
  for (uint32_t l = 0; l < config.n_layer; ++l) {
    k_.emplace_back(ctx, capacity_ * row_bytes_k_, MemoryUse::Device, "kv cache K layer " + std::to_string(l));
    v_.emplace_back(ctx, capacity_ * row_bytes_v_, MemoryUse::Device, "kv cache V layer " + std::to_string(l));
  }
}

uint64_t KvCache::device_bytes() const {
  uint64_t total = 0;
  for (const Buffer& b : k_) total += b.size();
  for (const Buffer& b : v_) total += b.size();
  return total;
}

int32_t KvCache::slot_of(uint32_t i) const {
  if (i < n_pinned_) return static_cast<int32_t>(i);
  const uint32_t window_slots = capacity_ - n_keep_;
  return static_cast<int32_t>(n_keep_ + (head_ + (i - n_pinned_)) % window_slots);
}

std::vector<int32_t> KvCache::append(std::span<const int32_t> tokens, std::vector<int32_t>& positions) {
  std::vector<int32_t> slots;
  slots.reserve(tokens.size());
  for (int32_t tok : tokens) {
    if (n_pinned_ < n_keep_) {  // still filling the pinned prefix
      VKLLM_CHECK(n_window_ == 0, "pinned tokens after window tokens");
      slots.push_back(static_cast<int32_t>(n_pinned_));
      tokens_.push_back(tok);
      ++n_pinned_;
      continue;
    }
    const uint32_t window_slots = capacity_ - n_keep_;
    if (n_window_ < window_slots) {
      slots.push_back(static_cast<int32_t>(n_keep_ + (head_ + n_window_) % window_slots));
      tokens_.push_back(tok);
      ++n_window_;
    } else {  // full: the new token takes the oldest window token's slot
      slots.push_back(static_cast<int32_t>(n_keep_ + head_));
      head_ = (head_ + 1) % window_slots;
      tokens_.erase(tokens_.begin() + n_pinned_);
      tokens_.push_back(tok);
      ++n_evicted_;
    }
  }
  // Positions are logical indices after the append: the new tokens are the last ones.
  positions.resize(tokens.size());
  const uint32_t first = used() - static_cast<uint32_t>(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) positions[i] = static_cast<int32_t>(first + i);
  return slots;
}

void KvCache::attention_lists(std::vector<int32_t>& slots, std::vector<int32_t>& positions) const {
  const uint32_t n = used();
  slots.resize(n);
  positions.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    slots[i] = slot_of(i);
    positions[i] = static_cast<int32_t>(i);
  }
}

void KvCache::truncate(uint32_t n) {
  VKLLM_CHECK(n <= used(), "truncate beyond the cached tokens");
  if (n == 0) {
    n_pinned_ = n_window_ = head_ = 0;
    n_evicted_ = 0;
    tokens_.clear();
    return;
  }
  if (n >= n_pinned_) {
    n_window_ = n - n_pinned_;  // drops the newest window tokens; the ring head stays
  } else {
    // Cutting into the pinned prefix: the window is gone and the pin shrinks to what remains.
    n_pinned_ = n;
    n_keep_ = n;
    n_window_ = 0;
    head_ = 0;
  }
  tokens_.resize(n);
}

void KvCache::set_keep(uint32_t n) {
  VKLLM_CHECK(n < capacity_, "--keep must leave room for the window");
  if (n == n_keep_) return;
  // With the ring head at 0 every slot holds its own logical index, so the split between pinned
  // tokens and window can move without moving data. The engine pins before the first wrap.
  VKLLM_CHECK(head_ == 0, "the pinned prefix can only change while the ring head is at slot 0");
  const uint32_t total = used();
  n_keep_ = n;
  n_pinned_ = std::min(total, n);
  n_window_ = total - n_pinned_;
}

std::vector<uint8_t> KvCache::read_rows(uint32_t n) const {
  VKLLM_CHECK(n <= used(), "read_rows beyond the cached tokens");
  // Runs of consecutive slots in logical order: at most three (pinned, window to the end of the
  // ring, window from its start), so a layer is a handful of copies.
  struct Run {
    uint32_t first, slot, count;
  };
  std::vector<Run> runs;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t s = static_cast<uint32_t>(slot_of(i));
    if (!runs.empty() && runs.back().slot + runs.back().count == s) ++runs.back().count;
    else runs.push_back({i, s, 1});
  }
  const uint64_t layer_bytes = uint64_t{n} * (row_bytes_k_ + row_bytes_v_);
  std::vector<uint8_t> out(layer_bytes * k_.size());
  if (n == 0) return out;
  // One staging buffer and one submit per layer: bounded host-visible memory for any model.
  Buffer staging(*ctx_, layer_bytes, MemoryUse::Readback, "kv read staging");
  CommandRecorder rec(*ctx_);
  for (size_t l = 0; l < k_.size(); ++l) {
    for (const Run& r : runs) {
      rec.copy(k_[l].view(r.slot * row_bytes_k_, r.count * row_bytes_k_), staging.view(r.first * row_bytes_k_, r.count * row_bytes_k_));
      rec.copy(v_[l].view(r.slot * row_bytes_v_, r.count * row_bytes_v_),
               staging.view(n * row_bytes_k_ + r.first * row_bytes_v_, r.count * row_bytes_v_));
    }
    rec.submit_and_wait();
    std::memcpy(out.data() + l * layer_bytes, staging.mapped(), layer_bytes);
  }
  return out;
}

void KvCache::restore(std::span<const int32_t> tokens, uint32_t n_keep, uint64_t n_evicted, std::span<const uint8_t> rows) {
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  VKLLM_CHECK(n <= capacity_ && n_keep < capacity_, "restore beyond the cache capacity");
  const uint64_t layer_bytes = uint64_t{n} * (row_bytes_k_ + row_bytes_v_);
  VKLLM_CHECK(rows.size() == layer_bytes * k_.size(), "restore: rows do not match the token count");
  if (n > 0) {
    Buffer staging(*ctx_, layer_bytes, MemoryUse::Upload, "kv restore staging");
    CommandRecorder rec(*ctx_);
    for (size_t l = 0; l < k_.size(); ++l) {
      std::memcpy(staging.mapped(), rows.data() + l * layer_bytes, layer_bytes);
      rec.copy(staging.view(0, n * row_bytes_k_), k_[l].view(0, n * row_bytes_k_));
      rec.copy(staging.view(n * row_bytes_k_, n * row_bytes_v_), v_[l].view(0, n * row_bytes_v_));
      rec.submit_and_wait();
    }
  }
  // Identity layout: with head_ = 0, pinned token i is in slot i and window token j (logical
  // n_keep + j) in slot n_keep + j.
  n_keep_ = n_keep;
  n_pinned_ = std::min(n, n_keep);
  n_window_ = n - n_pinned_;
  head_ = 0;
  n_evicted_ = n_evicted;
  tokens_.assign(tokens.begin(), tokens.end());
}

}  // namespace vkllm
