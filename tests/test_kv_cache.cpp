// The ring-buffer bookkeeping of KvCache: slots, positions, eviction, truncation, memory size.
#include <gtest/gtest.h>

#include "model/kv_cache.h"
#include "vk_test_env.h"

using namespace vkllm;

namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;  // n_embd_kv = 32: quantized cache types fit
  c.n_embd = 64;
  return c;
}

using KvCacheTest = test::VulkanTest;

TEST_F(KvCacheTest, DeviceMemoryIsCapacityTimesBytesPerToken) {
  for (CacheType t : {CacheType::F16, CacheType::Q8_0, CacheType::Q4_0}) {
    KvCache cache(test::vk(), tiny_config(), {100, t, t});
    EXPECT_EQ(cache.bytes_per_token(), kv_bytes_per_token(tiny_config(), t, t));
    EXPECT_EQ(cache.device_bytes(), 100 * cache.bytes_per_token()) << cache_type_name(t);
  }
  EXPECT_EQ(kv_bytes_per_token(tiny_config(), CacheType::F16, CacheType::F16), 2u * 2 * 32 * 2);
}

// Sliding-window layers with rings of their own (window 4, chunks of up to 4: 8 slots).
TEST_F(KvCacheTest, WindowRingsHoldTheWindowAndRefuseRewindsPastIt) {
  ModelConfig c = tiny_config();
  c.n_swa = 4;
  c.swa_pattern = 2;  // layer 0 is a window layer, layer 1 global
  KvCacheOptions o{32, CacheType::F16, CacheType::F16, 4};
  EXPECT_EQ(window_ring_slots(c, 32, 4), 8u);
  EXPECT_EQ(window_ring_slots(c, 8, 4), 0u);  // not fewer than the capacity: no ring
  KvCache cache(test::vk(), c, o);
  ASSERT_EQ(cache.window_ring(), 8u);
  EXPECT_EQ(cache.device_bytes(), (32u + 8u) * cache.bytes_per_token() / 2);
  EXPECT_EQ(cache.device_bytes(), kv_cache_bytes(c, CacheType::F16, CacheType::F16, 32, 8));
  KvCacheOptions full = o;
  full.swa_full = true;
  EXPECT_EQ(KvCache(test::vk(), c, full).window_ring(), 0u);
  std::vector<int32_t> pos, slots, positions;
  const std::vector<int32_t> chunk = {1, 2, 3, 4};
  cache.append(chunk, pos);
  cache.append(chunk, pos);
  EXPECT_EQ(cache.window_slots_of_last(4), (std::vector<int32_t>{4, 5, 6, 7}));
  cache.window_lists(4, slots, positions);  // the chunk and the 3 tokens before it
  EXPECT_EQ(positions, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(slots, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
  const std::vector<int32_t> two = {5, 6};
  cache.append(two, pos);  // serials 8, 9 overwrite window slots 0 and 1
  EXPECT_EQ(cache.window_slots_of_last(2), (std::vector<int32_t>{0, 1}));
  cache.window_lists(2, slots, positions);
  EXPECT_EQ(positions, (std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(slots, (std::vector<int32_t>{5, 6, 7, 0, 1}));
  // A rewind keeps its tokens' windows only while the ring still holds them.
  EXPECT_EQ(cache.reusable(10), 10u);
  EXPECT_EQ(cache.reusable(6), 6u);  // tokens 2…5 are held
  EXPECT_EQ(cache.reusable(5), 0u);  // token 1's slot now holds token 9
  cache.truncate(6);
  cache.append(two, pos);  // serials 6, 7 again
  EXPECT_EQ(cache.window_slots_of_last(2), (std::vector<int32_t>{6, 7}));
  cache.window_lists(1, slots, positions);
  EXPECT_EQ(positions, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(slots, (std::vector<int32_t>{4, 5, 6, 7}));
  // Pinned tokens must never fall inside a window the ring has moved past.
  EXPECT_EQ(cache.max_keep(), 24u);
  EXPECT_THROW(cache.set_keep(25), Error);
  cache.clear();
  cache.set_keep(24);
  EXPECT_EQ(cache.keep(), 24u);
}

// A session written by a cache with window rings has zero window rows for the tokens its rings
// had dropped. Restored into a cache without rings (--swa-full), those tokens are remembered as
// missing: rewinds that would read them are refused; a file missing the last window is refused.
TEST_F(KvCacheTest, RestoredZeroWindowRowsAreMissingWithoutRings) {
  ModelConfig c = tiny_config();
  c.n_swa = 4;
  c.swa_pattern = 2;  // layer 0 is a window layer
  KvCacheOptions o{32, CacheType::F16, CacheType::F16, 4, /*swa_full=*/true};
  KvCache cache(test::vk(), c, o);
  ASSERT_EQ(cache.window_ring(), 0u);
  const uint32_t n = 12;
  const uint64_t layer = uint64_t{n} * (cache.row_bytes_k() + cache.row_bytes_v());
  std::vector<uint8_t> rows(layer * c.n_layer, 0x3c);  // f16 1.0-ish bytes everywhere…
  for (uint32_t i = 0; i < 5; ++i)                     // …but tokens 0–4 have zero window K rows
    std::fill_n(rows.begin() + i * cache.row_bytes_k(), cache.row_bytes_k(), 0);
  const std::vector<int32_t> tokens(n, 7);
  ASSERT_TRUE(cache.restore(tokens, 1, 0, rows));
  EXPECT_EQ(cache.reusable(12), 12u);
  EXPECT_EQ(cache.reusable(9), 9u);  // tokens 5…8 are there
  EXPECT_EQ(cache.reusable(8), 0u);  // token 4's window rows are not
  // The last window missing: refused, nothing changed.
  std::fill_n(rows.begin() + 10 * cache.row_bytes_k(), cache.row_bytes_k(), 0);
  EXPECT_FALSE(cache.restore(tokens, 1, 0, rows));
  EXPECT_EQ(cache.reusable(8), 0u);
  EXPECT_EQ(cache.max_keep(), 31u);
}

TEST_F(KvCacheTest, RingEvictsOldestUnpinnedAndKeepsPositionsContiguous) {
  KvCache cache(test::vk(), tiny_config(), {8, CacheType::F16, CacheType::F16});
  cache.set_keep(2);
  std::vector<int32_t> pos;
  const std::vector<int32_t> first = {100, 101, 102, 103, 104, 105, 106, 107};
  EXPECT_EQ(cache.append(first, pos), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(cache.evicted(), 0u);
  // Full: token 108 takes slot 2 (token 102, the oldest window token), 109 takes slot 3.
  const std::vector<int32_t> more = {108, 109};
  EXPECT_EQ(cache.append(more, pos), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(pos, (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(cache.evicted(), 2u);
  EXPECT_EQ(cache.used(), 8u);
  EXPECT_EQ(cache.tokens(), (std::vector<int32_t>{100, 101, 104, 105, 106, 107, 108, 109}));
  std::vector<int32_t> slots, positions;
  cache.attention_lists(slots, positions);
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 1, 4, 5, 6, 7, 2, 3}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Many wraps: the pinned tokens never move, the window holds the newest six.
  for (int32_t t = 110; t < 140; ++t) cache.append(std::span(&t, 1), pos);
  EXPECT_EQ(cache.tokens(), (std::vector<int32_t>{100, 101, 134, 135, 136, 137, 138, 139}));
  cache.attention_lists(slots, positions);
  EXPECT_EQ(slots[0], 0);
  EXPECT_EQ(slots[1], 1);
  EXPECT_EQ(cache.evicted(), 32u);
  // Truncating drops the newest tokens; appending continues in ring order.
  cache.truncate(5);
  EXPECT_EQ(cache.tokens(), (std::vector<int32_t>{100, 101, 134, 135, 136}));
  const int32_t t = 200;
  const std::vector<int32_t> s = cache.append(std::span(&t, 1), pos);
  EXPECT_EQ(s[0], slots[5]);  // the slot that held 137
  EXPECT_EQ(pos[0], 5);
  cache.clear();
  EXPECT_EQ(cache.used(), 0u);
  EXPECT_EQ(cache.evicted(), 0u);
}

TEST_F(KvCacheTest, QuantizedTypeNeedsRowsOf32) {
  ModelConfig c = tiny_config();
  c.head_dim = 8;  // n_embd_kv = 16
  EXPECT_THROW(KvCache(test::vk(), c, {16, CacheType::Q8_0, CacheType::F16}), Error);
}

}  // namespace
