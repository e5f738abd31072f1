// StringIndex: linear probing over a power-of-two table kept at most half full.
#include "base/string_index.h"

#include <xxhash.h>

namespace vkllm {
namespace {

uint64_t hash_of(std::string_view s) { return XXH3_64bits(s.data(), s.size()); }
uint32_t tag_of(uint64_t h) { return uint32_t(h >> 32); }

}  // namespace

void StringIndex::reserve(size_t n) {
  size_t want = 16;
  while (want < 2 * n) want *= 2;
  if (want > slots_.size()) rehash(want);
  keys_.reserve(n);
  values_.reserve(n);
  hashes_.reserve(n);
}

void StringIndex::rehash(size_t n_slots) {
  slots_.assign(n_slots, Slot{});
  const size_t mask = n_slots - 1;
  for (size_t e = 0; e < keys_.size(); ++e) {
    size_t i = size_t(hashes_[e]) & mask;
    while (slots_[i].entry >= 0) i = (i + 1) & mask;
    slots_[i] = {tag_of(hashes_[e]), int32_t(e)};
  }
}

size_t StringIndex::probe(std::string_view key, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  const uint32_t tag = tag_of(hash);
  for (size_t i = size_t(hash) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.entry < 0 || (s.tag == tag && keys_[size_t(s.entry)] == key)) return i;
  }
}

bool StringIndex::insert(std::string_view key, int32_t value) {
  if (2 * (keys_.size() + 1) > slots_.size()) rehash(slots_.empty() ? 16 : 2 * slots_.size());
  const uint64_t h = hash_of(key);
  const size_t i = probe(key, h);
  if (slots_[i].entry >= 0) return false;
  slots_[i] = {tag_of(h), int32_t(keys_.size())};
  keys_.emplace_back(key);
  values_.push_back(value);
  hashes_.push_back(h);
  return true;
}

int32_t StringIndex::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const Slot& s = slots_[probe(key, hash_of(key))];
  return s.entry < 0 ? -1 : values_[size_t(s.entry)];
}

}  // namespace vkllm
