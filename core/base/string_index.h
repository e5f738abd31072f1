// StringIndex: a flat, open-addressing map from byte strings to int32 values (XXH3-hashed), for
// the tokenizer's hot lookups (token text → id, merge pair → rank).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vkllm {

class StringIndex {
 public:
  // Sizes the table for about `n` keys (it still grows when more are inserted).
  void reserve(size_t n);
  // Adds key → value; returns false and changes nothing when the key is already present.
  bool insert(std::string_view key, int32_t value);
  // The value for `key`, or -1.
  int32_t find(std::string_view key) const;
  size_t size() const { return keys_.size(); }

 private:
  struct Slot {
    uint32_t tag = 0;     // high bits of the hash, to skip most string compares
    int32_t entry = -1;   // index into keys_/values_, -1 when empty
  };
  void rehash(size_t n_slots);
  size_t probe(std::string_view key, uint64_t hash) const;  // slot holding key, or the empty one

  std::vector<Slot> slots_;  // [power of two], at most half full
  std::vector<std::string> keys_;
  std::vector<int32_t> values_;
  std::vector<uint64_t> hashes_;
};

}  // namespace vkllm
