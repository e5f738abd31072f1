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
