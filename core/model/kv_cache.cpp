// Ring-buffer bookkeeping of the KV cache and its device allocation.
#include "model/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "vk/commands.h"

namespace vkllm {
namespace {

// Row ids (KvCache::row_ids) are drawn from one counter for every cache in the process.
uint64_t new_row_ids(uint64_t n) {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(n);
}

}  // namespace

uint32_t window_ring_for(const ModelConfig& c, const KvCacheOptions& o) {
  return o.swa_full ? 0 : window_ring_slots(c, o.capacity, std::max<uint32_t>(o.n_ubatch, 1));
}

KvCache::KvCache(const VulkanContext& ctx, const ModelConfig& config, const KvCacheOptions& o)
    : ctx_(&ctx), capacity_(o.capacity), type_k_(o.type_k), type_v_(o.type_v) {
  const uint32_t row = config.n_embd_kv();
  for (CacheType t : {type_k_, type_v_})
    if (!cache_type_fits(t, row))
      throw Error(std::string("--cache-type ") + cache_type_name(t) + " " + cache_type_misfit(row));
  if (capacity_ < 2) throw Error("--ctx " + std::to_string(capacity_) + " is too small (at least 2 tokens)");
  row_bytes_k_ = cache_row_bytes(type_k_, row);
  row_bytes_v_ = cache_row_bytes(type_v_, row);
  bytes_per_token_ = kv_bytes_per_token(config, type_k_, type_v_);
  const uint64_t range = ctx.max_storage_range();
  if (uint64_t{capacity_} * std::max(row_bytes_k_, row_bytes_v_) > range)
    throw Error("--ctx " + std::to_string(capacity_) + " needs " + std::to_string(capacity_ * std::max(row_bytes_k_, row_bytes_v_)) +
                " bytes per layer, more than one binding of " + ctx.info().name + " can hold (" + std::to_string(range) +
                "); use --ctx " + std::to_string(range / std::max(row_bytes_k_, row_bytes_v_)) + " or a quantized --cache-type");
  window_ = config.n_swa;
  ring_slots_ = window_ring_for(config, o);
  if (ring_slots_) ring_serial_.assign(ring_slots_, -1);
  for (uint32_t l = 0; l < config.n_layer; ++l) {
    window_layer_.push_back(config.is_swa(l));
    ring_layer_.push_back(ring_slots_ && config.is_swa(l));
    const uint64_t slots = ring_layer_.back() ? ring_slots_ : capacity_;
    k_.emplace_back(ctx, slots * row_bytes_k_, MemoryUse::Device, "kv cache K layer " + std::to_string(l));
    v_.emplace_back(ctx, slots * row_bytes_v_, MemoryUse::Device, "kv cache V layer " + std::to_string(l));
  }
  if (o.rotated_k) {
    VKLLM_CHECK(type_k_ == CacheType::F16, "the rotated copy of K needs an f16 K cache");
    rot_.assign(capacity_, 0);
    for (uint32_t l = 0; l < config.n_layer; ++l)
      k_rot_.push_back(ring_layer_[l] ? Buffer() : Buffer(ctx, uint64_t{capacity_} * row_bytes_k_, MemoryUse::Device, "rotated K layer " + std::to_string(l)));
  }
}

uint32_t KvCache::rotation_list(std::vector<int32_t>& rot) const {
  const uint32_t n = used();
  rot.resize(n);
  uint32_t split = n;
  for (uint32_t i = 0; i < n; ++i) {
    rot[i] = rot_[static_cast<size_t>(slot_of(i))];
    if (split == n && rot[i] - int32_t(i) != rot[0]) split = i;
  }
  return split;
}

std::vector<int32_t> KvCache::rotations_of_last(uint32_t n) const {
  VKLLM_CHECK(!rot_.empty() && n <= used(), "rotation positions without a rotated copy");
  std::vector<int32_t> rot;
  for (uint32_t i = used() - n; i < used(); ++i) rot.push_back(rot_[static_cast<size_t>(slot_of(i))]);
  return rot;
}

KvCache::Shifts KvCache::rotation_shifts() const {
  Shifts s;
  s.split = used();
  if (rot_.empty() || used() == 0) return s;
  std::vector<int32_t> rot;
  s.split = rotation_list(rot);
  s.first = static_cast<uint32_t>(rot[0]);
  if (s.split < used()) s.rest = static_cast<uint32_t>(rot[s.split] - static_cast<int32_t>(s.split));
  s.next = static_cast<uint32_t>(n_evicted_ - rot_base_);
  return s;
}

void KvCache::rebase_rotations() {
  rot_base_ = n_evicted_;
  for (uint32_t i = 0; i < used(); ++i) rot_[static_cast<size_t>(slot_of(i))] = static_cast<int32_t>(i);
  rot_stale_ = true;
}

bool KvCache::two_shift_runs() const {
  uint32_t runs = 0;
  int32_t prev = 0;
  for (uint32_t i = 0; i < used(); ++i) {
    const int32_t shift = rot_[static_cast<size_t>(slot_of(i))] - static_cast<int32_t>(i);
    if (i == 0 || shift != prev) ++runs;
    prev = shift;
  }
  return runs <= 2;
}

uint64_t KvCache::bytes_used() const {
  uint64_t total = 0;
  for (size_t l = 0; l < k_.size(); ++l)
    total += uint64_t{is_ring_layer(l) ? std::min(used(), ring_slots_) : used()} * (row_bytes_k_ + row_bytes_v_);
  return total;
}


bool KvCache::window_row_held(uint32_t i) const {
  if (!ring_slots_) return window_absent_.empty() || !window_absent_[i];
  const int64_t serial = serial_[i];
  return ring_serial_[static_cast<size_t>(serial % ring_slots_)] == serial;
}

std::vector<int32_t> KvCache::window_slots_of_last(uint32_t n) const {
  VKLLM_CHECK(ring_slots_ && n <= used(), "window slots without a window ring");
  std::vector<int32_t> slots;
  for (uint32_t i = used() - n; i < used(); ++i) slots.push_back(static_cast<int32_t>(serial_[i] % ring_slots_));
  return slots;
}

void KvCache::window_lists(uint32_t n_new, std::vector<int32_t>& slots, std::vector<int32_t>& positions) const {
  VKLLM_CHECK(ring_slots_ && n_new <= used(), "window lists without a window ring");
  const uint32_t reach = n_new + window_ - 1;  // the chunk and the window before its first token
  const uint32_t first = used() > reach ? used() - reach : 0;
  slots.clear();
  positions.clear();
  for (uint32_t i = first; i < used(); ++i) {
    VKLLM_CHECK(window_row_held(i), "a window layer's ring lost a row its window reads");
    slots.push_back(static_cast<int32_t>(serial_[i] % ring_slots_));
    positions.push_back(static_cast<int32_t>(i));
  }
}

bool KvCache::window_held_before(uint32_t n, uint32_t count) const {
  for (uint32_t i = n > count ? n - count : 0; i < n; ++i)
    if (!window_row_held(i)) return false;
  return true;
}

uint32_t KvCache::reusable(uint32_t n) const {
  VKLLM_CHECK(n <= used(), "reusable beyond the cached tokens");
  // The next token's window reads the window_ − 1 tokens before it; one more keeps a resume
  // (truncate by one, decode the last token again) possible.
  return !window_ || window_held_before(n, window_) ? n : 0;
}

uint64_t KvCache::device_bytes() const {
  uint64_t total = 0;
  for (const Buffer& b : k_) total += b.size();
  for (const Buffer& b : v_) total += b.size();
  for (const Buffer& b : k_rot_) total += b.size();
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
  uint64_t id = new_row_ids(tokens.size());
  for (int32_t tok : tokens) {
    // Serial numbers run on along the logical sequence (after a truncation, from the last kept).
    const int64_t serial = serial_.empty() ? 0 : serial_.back() + 1;
    if (ring_slots_) ring_serial_[static_cast<size_t>(serial % ring_slots_)] = serial;
    if (n_pinned_ < n_keep_) {  // still filling the pinned prefix
      VKLLM_CHECK(n_window_ == 0, "pinned tokens after window tokens");
      slots.push_back(static_cast<int32_t>(n_pinned_));
      tokens_.push_back(tok);
      row_ids_.push_back(id++);
      serial_.push_back(serial);
      if (!window_absent_.empty()) window_absent_.push_back(false);
      ++n_pinned_;
      continue;
    }
    const uint32_t window_slots = capacity_ - n_keep_;
    if (n_window_ < window_slots) {
      slots.push_back(static_cast<int32_t>(n_keep_ + (head_ + n_window_) % window_slots));
      tokens_.push_back(tok);
      row_ids_.push_back(id++);
      serial_.push_back(serial);
      if (!window_absent_.empty()) window_absent_.push_back(false);
      ++n_window_;
    } else {  // full: the new token takes the oldest window token's slot
      slots.push_back(static_cast<int32_t>(n_keep_ + head_));
      head_ = (head_ + 1) % window_slots;
      tokens_.erase(tokens_.begin() + n_pinned_);
      tokens_.push_back(tok);
      row_ids_.erase(row_ids_.begin() + n_pinned_);
      row_ids_.push_back(id++);
      serial_.erase(serial_.begin() + n_pinned_);
      serial_.push_back(serial);
      if (!window_absent_.empty()) {
        window_absent_.erase(window_absent_.begin() + n_pinned_);
        window_absent_.push_back(false);
      }
      ++n_evicted_;
    }
  }
  // Positions are logical indices after the append: the new tokens are the last ones.
  positions.resize(tokens.size());
  const uint32_t first = used() - static_cast<uint32_t>(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) positions[i] = static_cast<int32_t>(first + i);
  if (!rot_.empty()) {
    // The new rows rotate one shift ahead of their positions, as the window's older rows now are.
    const uint64_t shift = n_evicted_ - rot_base_;
    for (size_t i = 0; i < tokens.size(); ++i) rot_[static_cast<size_t>(slots[i])] = positions[i] + static_cast<int32_t>(shift);
    // (Rotation positions stay below twice the capacity, rope_positions_for.)
    if (shift >= capacity_ || !two_shift_runs()) rebase_rotations();
  }
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
    n_evicted_ = rot_base_ = 0;
    tokens_.clear();
    row_ids_.clear();
    serial_.clear();
    window_absent_.clear();
    std::fill(ring_serial_.begin(), ring_serial_.end(), -1);
    return;
  }
  VKLLM_CHECK(!window_ || window_held_before(n, window_ - 1), "truncate past the window rows the cache holds (use reusable())");
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
  row_ids_.resize(n);
  serial_.resize(n);
  if (!window_absent_.empty()) window_absent_.resize(n);
}

std::string keep_refusal(uint32_t n, uint32_t capacity, uint32_t ring_slots) {
  if (!ring_slots || n <= capacity - ring_slots) return "";
  return "--keep " + std::to_string(n) + " is too long: this model's sliding-window layers keep " + std::to_string(ring_slots) +
         " slots, so at most " + std::to_string(capacity - ring_slots) + " of --ctx " + std::to_string(capacity) +
         " tokens can be pinned; use a larger --ctx";
}

void KvCache::set_keep(uint32_t n) {
  VKLLM_CHECK(n < capacity_, "--keep must leave room for the window");
  if (const std::string refusal = keep_refusal(n, capacity_, ring_slots_); !refusal.empty()) throw Error(refusal);
  if (n == n_keep_) return;
  // With the ring head at 0 every slot holds its own logical index, so the split between pinned
  // tokens and window can move without moving data. The engine pins before the first wrap.
  VKLLM_CHECK(head_ == 0, "the pinned prefix can only change while the ring head is at slot 0");
  const uint32_t total = used();
  n_keep_ = n;
  n_pinned_ = std::min(total, n);
  n_window_ = total - n_pinned_;
}

namespace {

// Logical tokens [first, first + count) in consecutive slots from `slot`.
struct Run {
  uint32_t first, slot, count;
};

void add_to_runs(std::vector<Run>& runs, uint32_t i, uint32_t slot) {
  if (!runs.empty() && runs.back().first + runs.back().count == i && runs.back().slot + runs.back().count == slot) ++runs.back().count;
  else runs.push_back({i, slot, 1});
}

bool all_zero(const uint8_t* p, uint64_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

}  // namespace

std::vector<uint8_t> KvCache::read_rows(uint32_t first, uint32_t n) const {
  VKLLM_CHECK(first <= used() && n <= used() - first, "read_rows beyond the cached tokens");
  // Runs of consecutive slots in logical order: at most three for the global layers (pinned, window
  // to the end of the ring, window from its start), so a layer is a handful of copies; a window
  // ring's runs skip the tokens it no longer holds (their rows stay zero). Runs count from `first`.
  std::vector<Run> runs, ring_runs;
  for (uint32_t i = 0; i < n; ++i) {
    add_to_runs(runs, i, static_cast<uint32_t>(slot_of(first + i)));
    if (ring_slots_ && window_row_held(first + i)) add_to_runs(ring_runs, i, static_cast<uint32_t>(serial_[first + i] % ring_slots_));
  }
  const uint64_t layer_bytes = uint64_t{n} * (row_bytes_k_ + row_bytes_v_);
  std::vector<uint8_t> out(layer_bytes * k_.size());
  if (n == 0) return out;
  // One staging buffer and one submit per layer: bounded host-visible memory for any model.
  Buffer staging(*ctx_, layer_bytes, MemoryUse::Readback, "kv read staging");
  CommandRecorder rec(*ctx_);
  for (size_t l = 0; l < k_.size(); ++l) {
    if (is_ring_layer(l)) std::memset(staging.mapped(), 0, layer_bytes);
    for (const Run& r : is_ring_layer(l) ? ring_runs : runs) {
      rec.copy(k_[l].view(r.slot * row_bytes_k_, r.count * row_bytes_k_), staging.view(r.first * row_bytes_k_, r.count * row_bytes_k_));
      rec.copy(v_[l].view(r.slot * row_bytes_v_, r.count * row_bytes_v_),
               staging.view(n * row_bytes_k_ + r.first * row_bytes_v_, r.count * row_bytes_v_));
    }
    rec.submit_and_wait();
    std::memcpy(out.data() + l * layer_bytes, staging.mapped(), layer_bytes);
  }
  return out;
}

bool KvCache::restore(std::span<const int32_t> tokens, uint32_t n_keep, uint64_t n_evicted, std::span<const uint8_t> rows,
                      const Shifts* shifts) {
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  VKLLM_CHECK(n <= capacity_ && n_keep <= max_keep(), "restore beyond the cache capacity");
  const uint64_t layer_bytes = uint64_t{n} * (row_bytes_k_ + row_bytes_v_);
  VKLLM_CHECK(rows.size() == layer_bytes * k_.size(), "restore: rows do not match the token count");
  // A token's window rows are in the file when no window layer's K row is all zeros (a file
  // stores zeros for rows its window rings had lost). The window before the end must be there,
  // as reusable(n) requires, whether this cache has rings or not; with rings, token i goes to
  // window slot i % ring slots (serial i) when its rows are there.
  auto has_window_rows = [&](uint32_t i) {
    for (size_t l = 0; l < k_.size(); ++l)
      if (window_layer_[l] && all_zero(rows.data() + l * layer_bytes + uint64_t{i} * row_bytes_k_, row_bytes_k_)) return false;
    return true;
  };
  if (window_)
    for (uint32_t i = n > window_ ? n - window_ : 0; i < n; ++i)
      if (!has_window_rows(i)) return false;
  std::vector<bool> held(n, false);
  if (ring_slots_)
    for (uint32_t i = n > ring_slots_ ? n - ring_slots_ : 0; i < n; ++i) held[i] = has_window_rows(i);
  std::vector<bool> absent;
  if (window_ && !ring_slots_) {
    absent.resize(n);
    for (uint32_t i = 0; i < n; ++i) absent[i] = !has_window_rows(i);
    if (std::find(absent.begin(), absent.end(), true) == absent.end()) absent.clear();
  }
  if (n > 0) {
    std::vector<Run> ring_runs;
    for (uint32_t i = 0; i < n; ++i)
      if (ring_slots_ && held[i]) add_to_runs(ring_runs, i, i % ring_slots_);
    Buffer staging(*ctx_, layer_bytes, MemoryUse::Upload, "kv restore staging");
    CommandRecorder rec(*ctx_);
    for (size_t l = 0; l < k_.size(); ++l) {
      std::memcpy(staging.mapped(), rows.data() + l * layer_bytes, layer_bytes);
      const std::vector<Run> identity = {{0, 0, n}};
      for (const Run& r : is_ring_layer(l) ? ring_runs : identity) {
        rec.copy(staging.view(r.first * row_bytes_k_, r.count * row_bytes_k_), k_[l].view(r.slot * row_bytes_k_, r.count * row_bytes_k_));
        rec.copy(staging.view(n * row_bytes_k_ + r.first * row_bytes_v_, r.count * row_bytes_v_),
                 v_[l].view(r.slot * row_bytes_v_, r.count * row_bytes_v_));
      }
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
  row_ids_.resize(n);
  const uint64_t first_id = new_row_ids(n);
  for (uint32_t i = 0; i < n; ++i) row_ids_[i] = first_id + i;
  serial_.resize(n);
  for (uint32_t i = 0; i < n; ++i) serial_[i] = i;
  std::fill(ring_serial_.begin(), ring_serial_.end(), -1);
  for (uint32_t i = 0; i < n; ++i)
    if (ring_slots_ && held[i]) ring_serial_[i % ring_slots_] = i;
  window_absent_ = std::move(absent);
  if (!rot_.empty()) {
    // The saving cache's shifts, where this cache can hold them (shifts below its capacity keep
    // rotation positions inside the rope table; an eviction count that covers the next shift).
    const bool fits = shifts && shifts->split <= n && shifts->first < capacity_ && shifts->rest < capacity_ &&
                      shifts->next < capacity_ && shifts->next <= n_evicted;
    rebase_rotations();
    if (fits) {
      rot_base_ = n_evicted - shifts->next;
      for (uint32_t i = 0; i < n; ++i) rot_[static_cast<size_t>(slot_of(i))] = static_cast<int32_t>(i + (i < shifts->split ? shifts->first : shifts->rest));
    }
  }
  return true;
}

}  // namespace vkllm
