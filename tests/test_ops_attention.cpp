// rope table, kv_store and attention shaders against the scalar references: both RoPE layouts with
// frequency factors, every cache type, grouped-query shapes, ring-ordered slot lists, the
// split-KV decode path, sliding windows and soft-capped scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "op_test_util.h"
#include "kernels/ops.h"
#include "reference/ref_ops.h"

using namespace vkllm;
using gguf::TensorType;

namespace {

using AttentionOps = test::VulkanTest;

TensorType ref_type(CacheType t) {
  return t == CacheType::F16 ? TensorType::F16 : t == CacheType::Q8_0 ? TensorType::Q8_0 : TensorType::Q4_0;
}

ref::RopeParams ref_rope(uint32_t head_dim, uint32_t n_rot, bool neox, const std::vector<float>* factors) {
  ref::RopeParams p;
  p.head_dim = head_dim;
  p.n_rot = n_rot;
  p.freq_base = 10000.0f;
  p.freq_scale = 0.5f;
  p.style = neox ? RopeStyle::NeoX : RopeStyle::Normal;
  p.freq_factors = factors ? factors->data() : nullptr;
  return p;
}

// The rope table (cos, sin of every position's pair angles) rotates like the reference RoPE, in
// both pair layouts, with per-pair frequency factors, partial rotation and YaRN (its ramp from pair
// 10 to 23 of 32, or 5 to 12 of 16, for an original context of 4,096; with and without factors;
// attn_factor 1.25): x rotated on the host with the table's entries equals ref::rope.
TEST_F(AttentionOps, RopeTableBothLayoutsWithFactors) {
  for (bool neox : {false, true}) {
    for (uint32_t n_rot : {64u, 32u}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool with_factors = variant == 1 || variant == 3, yarn = variant >= 2;
        const uint32_t n_tokens = 5, n_heads = 3, head_dim = 64, n_pos = 4096;
        const auto x = test::random_floats(size_t(n_tokens) * n_heads * head_dim, n_rot + neox);
        const std::vector<int32_t> pos = {0, 1, 17, 1000, 4095};
        std::vector<float> factors(n_rot / 2);
        for (uint32_t i = 0; i < n_rot / 2; ++i) factors[i] = 1.0f + 0.25f * float(i % 5);
        std::vector<float> want(x.size());
        ref::RopeParams rp = ref_rope(head_dim, n_rot, neox, with_factors ? &factors : nullptr);
        Buffer df = test::to_device(factors), dt(test::vk(), uint64_t{n_pos} * head_dim * 4, MemoryUse::Device, "rope table");
        RopeConfig rc{head_dim, n_rot, 10000.0f, 0.5f, neox, with_factors ? df.view() : BufferView{}};
        if (yarn) {
          rp.attn_factor = rc.attn_factor = 1.25f;
          rp.ext_factor = rc.ext_factor = 1.0f;
          rp.n_ctx_orig = rc.n_ctx_orig = 4096;
        }
        ref::rope(x.data(), pos.data(), n_tokens, n_heads, rp, want.data());
        CommandRecorder rec(test::vk(), &test::pipelines());
        record_rope_table(rec, dt.view(), n_pos, rc);
        rec.submit_and_wait();
        const auto table = test::from_device<float>(dt, size_t(n_pos) * head_dim);
        std::vector<float> got = x;
        for (uint32_t t = 0; t < n_tokens; ++t) {
          for (uint32_t h = 0; h < n_heads; ++h) {
            float* v = got.data() + (size_t(t) * n_heads + h) * head_dim;
            for (uint32_t i = 0; i < n_rot / 2; ++i) {
              const uint32_t d0 = neox ? i : 2 * i, d1 = neox ? i + n_rot / 2 : 2 * i + 1;
              const float c = table[(size_t(pos[t]) * head_dim / 2 + i) * 2], s = table[(size_t(pos[t]) * head_dim / 2 + i) * 2 + 1];
              const float a = v[d0], b = v[d1];
              v[d0] = a * c - b * s;
              v[d1] = a * s + b * c;
            }
          }
        }
        EXPECT_LE(test::nmse(got, want), 1e-7) << "neox " << neox << " n_rot " << n_rot << " factors " << with_factors << " yarn " << yarn;
      }
    }
  }
}

TEST_F(AttentionOps, KvStoreMatchesGgmlQuantization) {
  for (CacheType ct : {CacheType::F16, CacheType::Q8_0, CacheType::Q4_0}) {
    const uint32_t row_len = 96, n_slots = 10, n_tokens = 4;
    const auto src = test::random_floats(size_t(n_tokens) * row_len, row_len, -3, 3);
    const std::vector<int32_t> slots = {7, 2, 9, 0};
    const uint64_t row_bytes = cache_row_bytes(ct, row_len);
    std::vector<uint8_t> want(row_bytes * n_slots, 0);
    ref::kv_store(ref_type(ct), src.data(), n_tokens, row_len, slots.data(), want.data());
    Buffer ds = test::to_device(src), dslots = test::to_device(slots), dc = test::to_device(std::vector<uint8_t>(want.size(), 0));
    CommandRecorder rec(test::vk(), &test::pipelines());
    record_kv_store(rec, ct, ds.view(), row_len, dslots.view(), n_tokens, row_len, dc.view());
    rec.submit_and_wait();
    const auto got = test::from_device<uint8_t>(dc, want.size());
    std::vector<float> g(size_t(n_slots) * row_len), w(g.size());
    for (uint32_t s = 0; s < n_slots; ++s) {
      ref::dequantize_row(ref_type(ct), got.data() + s * row_bytes, g.data() + size_t(s) * row_len, row_len);
      ref::dequantize_row(ref_type(ct), want.data() + s * row_bytes, w.data() + size_t(s) * row_len, row_len);
    }
    EXPECT_LE(test::nmse(g, w), 1e-7) << cache_type_name(ct);

    // K and V of the same tokens in one dispatch: V rows at 512 floats past the K rows in one
    // buffer, each into its own cache; and with the two caches of different types (two dispatches).
    const auto v_src = test::random_floats(size_t(n_tokens) * row_len, row_len + 1, -3, 3);
    std::vector<float> kv(512 + v_src.size());
    std::copy(src.begin(), src.end(), kv.begin());
    std::copy(v_src.begin(), v_src.end(), kv.begin() + 512);
    for (CacheType vt : {ct, ct == CacheType::F16 ? CacheType::Q8_0 : CacheType::F16}) {
      SCOPED_TRACE(std::string("K ") + cache_type_name(ct) + ", V " + cache_type_name(vt));
      const uint64_t v_row_bytes = cache_row_bytes(vt, row_len);
      std::vector<uint8_t> v_want(v_row_bytes * n_slots, 0);
      ref::kv_store(ref_type(vt), v_src.data(), n_tokens, row_len, slots.data(), v_want.data());
      Buffer dkv = test::to_device(kv), dk = test::to_device(std::vector<uint8_t>(want.size(), 0)),
             dv = test::to_device(std::vector<uint8_t>(v_want.size(), 0));
      CommandRecorder pair(test::vk(), &test::pipelines());
      record_kv_store_pair(pair, ct, vt, dkv.view(0, src.size() * 4), dkv.view(512 * 4, v_src.size() * 4), row_len, dslots.view(),
                           n_tokens, row_len, dk.view(), dv.view());
      pair.submit_and_wait();
      EXPECT_EQ(test::from_device<uint8_t>(dk, want.size()), got);
      std::vector<float> gv(size_t(n_slots) * row_len), wv(gv.size());
      const auto got_v = test::from_device<uint8_t>(dv, v_want.size());
      for (uint32_t s = 0; s < n_slots; ++s) {
        ref::dequantize_row(ref_type(vt), got_v.data() + s * v_row_bytes, gv.data() + size_t(s) * row_len, row_len);
        ref::dequantize_row(ref_type(vt), v_want.data() + s * v_row_bytes, wv.data() + size_t(s) * row_len, row_len);
      }
      EXPECT_LE(test::nmse(gv, wv), 1e-7);
    }
  }
}

struct AttnCase {
  uint32_t n_head, n_head_kv, head_dim, n_q, n_kv, n_slots;
  bool neox;
  uint32_t gap = 0;  // positions of the second half of the slot list jump by this much
  uint32_t window = 0;   // sliding window (Gemma): positions > query − window only
  float softcap = 0.0f;  // Gemma 2's score soft-capping
};

// Stores raw K/V with kv_store, runs attention (K rotated as read) and compares with the reference
// run on K rotated in f32 after the same cache rounding. `rotated`: kv_store also writes the
// rotated copy of K, each row at its position plus a shift (0 for the first third of the list, 11
// after it, as pinned tokens and a window after evictions), which kv_rotate rebuilds bit for bit
// from the cache, and attention reads it instead of rotating K. `at_offsets`: q, the slot list and
// its positions (and rotation positions) are bound at an offset into their buffers, behind garbage,
// as the engine binds a sequence's rows of a batch and a window layer's suffix of the list.
const char* kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::Simd: return " simd";
    case AttentionKernel::Lanes: return " lanes";
    case AttentionKernel::Tiled: return " tiled";
    default: return " auto";
  }
}

void check_attention(CacheType ct, const AttnCase& c, bool split, AttentionKernel kernel, bool rotated = false,
                     bool at_offsets = false) {
  SCOPED_TRACE(std::string(cache_type_name(ct)) + " heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) +
               " hd " + std::to_string(c.head_dim) + " q " + std::to_string(c.n_q) + " kv " + std::to_string(c.n_kv) +
               (split ? " split" : "") + kernel_name(kernel) + " window " +
               std::to_string(c.window) + " softcap " + std::to_string(c.softcap) + (rotated ? " rotated K" : "") +
               (at_offsets ? " at offsets" : ""));
  const uint32_t row_len = c.n_head_kv * c.head_dim;
  const uint64_t row_bytes = cache_row_bytes(ct, row_len);
  std::mt19937 rng(c.n_kv * 31 + c.n_q);
  // Slot list in ring order: a random permutation of slots, positions 0..n_kv-1 (plus the gap in
  // the second half; the queries are the last n_q positions).
  std::vector<int32_t> slot_ids(c.n_slots);
  std::iota(slot_ids.begin(), slot_ids.end(), 0);
  std::shuffle(slot_ids.begin(), slot_ids.end(), rng);
  std::vector<int32_t> kv_slots(slot_ids.begin(), slot_ids.begin() + c.n_kv), kv_pos(c.n_kv), q_pos(c.n_q);
  for (uint32_t i = 0; i < c.n_kv; ++i) kv_pos[i] = int32_t(i + (i >= c.n_kv / 2 ? c.gap : 0));
  for (uint32_t i = 0; i < c.n_q; ++i) q_pos[i] = kv_pos[c.n_kv - c.n_q + i];
  const uint32_t rot_split = c.n_kv / 3, rot_shift = 11;
  std::vector<int32_t> kv_rot(c.n_kv);
  for (uint32_t i = 0; i < c.n_kv; ++i) kv_rot[i] = kv_pos[i] + int32_t(i < rot_split ? 0 : rot_shift);
  const uint32_t n_pos = uint32_t(kv_pos.back()) + 1 + (rotated ? rot_shift : 0);

  const auto k_raw = test::random_floats(size_t(c.n_kv) * row_len, 1 + c.n_kv, -2, 2);
  const auto v_raw = test::random_floats(size_t(c.n_kv) * row_len, 2 + c.n_kv, -2, 2);
  const auto q = test::random_floats(size_t(c.n_q) * c.n_head * c.head_dim, 3 + c.n_q, -2, 2);

  // A model's own query scale (Gemma's) when soft-capping, so both settings are covered.
  const float scale = c.softcap > 0.0f ? 0.3f : 0.0f;
  // Reference: cache-round K and V, rotate K at its position, attend over an f32 cache.
  std::vector<uint8_t> kq(row_bytes * c.n_slots), vq(row_bytes * c.n_slots);
  ref::kv_store(ref_type(ct), k_raw.data(), c.n_kv, row_len, kv_slots.data(), kq.data());
  ref::kv_store(ref_type(ct), v_raw.data(), c.n_kv, row_len, kv_slots.data(), vq.data());
  std::vector<float> kf(size_t(c.n_slots) * row_len, 0.0f), vf(kf.size(), 0.0f), krot(kf.size(), 0.0f);
  for (uint32_t s = 0; s < c.n_slots; ++s) {
    ref::dequantize_row(ref_type(ct), kq.data() + s * row_bytes, kf.data() + size_t(s) * row_len, row_len);
    ref::dequantize_row(ref_type(ct), vq.data() + s * row_bytes, vf.data() + size_t(s) * row_len, row_len);
  }
  std::vector<int32_t> slot_pos(c.n_slots, 0);
  for (uint32_t i = 0; i < c.n_kv; ++i) slot_pos[kv_slots[i]] = kv_pos[i];
  ref::rope(kf.data(), slot_pos.data(), c.n_slots, c.n_head_kv, ref_rope(c.head_dim, c.head_dim, c.neox, nullptr), krot.data());
  // q arrives un-rotated too: the kernels rotate it at its token's position.
  std::vector<float> qrot(q.size());
  ref::rope(q.data(), q_pos.data(), c.n_q, c.n_head, ref_rope(c.head_dim, c.head_dim, c.neox, nullptr), qrot.data());
  std::vector<float> want(size_t(c.n_q) * c.n_head * c.head_dim);
  ref::attention(qrot.data(), q_pos.data(), c.n_q, TensorType::F32, reinterpret_cast<const uint8_t*>(krot.data()),
                 reinterpret_cast<const uint8_t*>(vf.data()), kv_slots.data(), kv_pos.data(), c.n_kv,
                 {c.n_head, c.n_head_kv, c.head_dim, scale, c.softcap, c.window}, want.data());

  // With offsets: `pad` bytes of garbage before q and the lists (the device's storage offset
  // alignment, at least one 16-byte texel).
  const uint64_t pad = at_offsets ? std::max<uint64_t>(test::vk().limits().minStorageBufferOffsetAlignment, 16) : 0;
  const auto behind = [&](const auto& v, auto junk) {
    auto out = v;
    out.insert(out.begin(), pad / sizeof(v[0]), junk);
    return test::to_device(out);
  };
  const auto view = [&](const Buffer& b, uint64_t bytes) { return b.view(pad, bytes); };
  Buffer dk_raw = test::to_device(k_raw), dv_raw = test::to_device(v_raw), dq = behind(q, 1e30f);
  Buffer dslots = behind(kv_slots, int32_t{-7}), dpos = behind(kv_pos, int32_t{1 << 30}), dqpos = test::to_device(q_pos);
  Buffer dkc = test::to_device(std::vector<uint8_t>(kq.size(), 0)), dvc = test::to_device(std::vector<uint8_t>(vq.size(), 0));
  Buffer dout = test::to_device(std::vector<float>(want.size(), 0.0f));
  const AttentionShape shape{c.n_head, c.n_head_kv, c.head_dim, kernel, scale, c.softcap, c.window};
  // Room for the scores of 4 query tokens: a longer prefill over ≥ 256 slots runs in groups.
  Buffer scratch(test::vk(), attention_scratch_floats(shape, c.n_kv, 4) * 4, MemoryUse::Device, "attention scratch");
  const RopeConfig rc{c.head_dim, c.head_dim, 10000.0f, 0.5f, c.neox, {}};
  Buffer table(test::vk(), uint64_t{n_pos} * c.head_dim * 4, MemoryUse::Device, "rope table");
  Buffer drot = behind(kv_rot, int32_t{1 << 30});
  const BufferView slots_v = view(dslots, kv_slots.size() * 4), pos_v = view(dpos, kv_pos.size() * 4),
                   rot_v = view(drot, kv_rot.size() * 4), q_v = view(dq, q.size() * 4);
  Buffer dcopy = test::to_device(std::vector<uint8_t>(kq.size(), 0)), drebuilt = test::to_device(std::vector<uint8_t>(kq.size(), 0));
  const RotatedK copy{dcopy.view(), rot_v, table.view(), rc, rot_split};
  CommandRecorder rec(test::vk(), &test::pipelines());
  record_rope_table(rec, table.view(), n_pos, rc);
  rec.barrier();
  if (rotated) {
    record_kv_store_pair(rec, ct, ct, dk_raw.view(), dv_raw.view(), row_len, slots_v, c.n_kv, row_len, dkc.view(), dvc.view(), copy);
    rec.barrier();
    record_kv_rotate(rec, dkc.view(), slots_v, c.n_kv, row_len, RotatedK{drebuilt.view(), rot_v, table.view(), rc});
  } else {
    record_kv_store(rec, ct, dk_raw.view(), row_len, slots_v, c.n_kv, row_len, dkc.view());
    record_kv_store(rec, ct, dv_raw.view(), row_len, slots_v, c.n_kv, row_len, dvc.view());
  }
  rec.barrier();
  record_attention(rec, ct, shape, rc, table.view(), q_v, c.n_head * c.head_dim, dqpos.view(), c.n_q, dkc.view(), dvc.view(),
                   slots_v, pos_v, c.n_kv, dout.view(), c.n_head * c.head_dim,
                   split ? scratch.view() : BufferView{}, rotated ? copy : RotatedK{});
  rec.submit_and_wait();
  EXPECT_LE(test::nmse(test::from_device<float>(dout, want.size()), want), 5e-4);
  if (rotated) {
    const auto stored = test::from_device<uint8_t>(dcopy, kq.size()), rebuilt = test::from_device<uint8_t>(drebuilt, kq.size());
    if (stored != rebuilt) {
      size_t differ = 0, first = SIZE_MAX;
      for (size_t i = 0; i + 1 < stored.size(); i += 2)
        if (stored[i] != rebuilt[i] || stored[i + 1] != rebuilt[i + 1]) differ += first == SIZE_MAX ? (first = i, 1) : 1;
      const auto bits = [](const std::vector<uint8_t>& b, size_t i) { return unsigned(b[i] | (b[i + 1] << 8)); };
      ADD_FAILURE() << "kv_rotate's rows differ from kv_store's in " << differ << " of " << stored.size() / 2
                    << " f16 elements; the first, element " << first / 2 << ": stored 0x" << std::hex << bits(stored, first)
                    << ", rebuilt 0x" << bits(rebuilt, first);
    }
    // The copy holds each row rotated at its rotation position, head-major ([n_head_kv][n_slots]
    // [head_dim]): the reference rotation of the cached row, to f16 rounding.
    std::vector<int32_t> slot_rot(c.n_slots, 0);
    for (uint32_t i = 0; i < c.n_kv; ++i) slot_rot[kv_slots[i]] = kv_rot[i];
    std::vector<float> want_rot(kf.size()), got_rot(kf.size(), 0.0f);
    ref::rope(kf.data(), slot_rot.data(), c.n_slots, c.n_head_kv, ref_rope(c.head_dim, c.head_dim, c.neox, nullptr), want_rot.data());
    ref::dequantize_row(TensorType::F16, stored.data(), got_rot.data(), got_rot.size());
    for (uint32_t i = 0; i < c.n_kv; ++i)
      for (uint32_t h = 0; h < c.n_head_kv; ++h)
        for (uint32_t d = 0; d < c.head_dim; ++d) {
          const float want_e = want_rot[size_t(kv_slots[i]) * row_len + h * c.head_dim + d];
          EXPECT_NEAR(got_rot[(size_t(h) * c.n_slots + kv_slots[i]) * c.head_dim + d], want_e, 2e-3f * (1.0f + std::abs(want_e)));
        }
  }
}

TEST_F(AttentionOps, PrefillAndDecodeEveryCacheType) {
  const AttnCase cases[] = {
      {8, 4, 8, 1, 1, 4, false},       // stories260K shape, first token
      {8, 4, 8, 23, 23, 40, false},    // prefill from empty
      {4, 2, 64, 1, 300, 512, false},  // decode over a long context
      {4, 2, 64, 37, 100, 128, true},  // prefill after a cached prefix, NeoX
      {2, 1, 64, 5, 77, 80, true},     // qwen2-like GQA 2:1
      {4, 4, 128, 3, 50, 64, false},   // no GQA, head dim 128
      {8, 4, 8, 15, 2366, 2560, false},  // a short prefill after a long restored prefix (splits)
      {8, 4, 8, 70, 300, 320, true},   // several row tiles over a cached prefix, NeoX
      {4, 2, 32, 9, 60, 64, true},     // several rows per attention_simd workgroup
      {4, 2, 64, 2, 700, 720, false, 5},  // positions that jump mid-list (RoPE angles reloaded), long runs
      {8, 4, 16, 3, 45, 64, true, 3},     // a jump inside a block of slots, NeoX
      {4, 2, 64, 1, 300, 512, false, 0, 32},        // decode with a sliding window (Gemma)
      {4, 2, 64, 40, 200, 256, true, 0, 16},        // prefill with a window shorter than the chunk
      {8, 4, 16, 3, 500, 512, true, 0, 100, 2.0f},  // a window and soft-capped scores (Gemma 2)
      {4, 2, 32, 9, 60, 64, false, 0, 0, 1.0f},     // soft-capping alone, caps well inside the scores' range
      {6, 2, 64, 1, 400, 512, true, 7},             // decode over ≥ 256 slots (attention_decode on CPU drivers): odd G
      {8, 1, 64, 1, 260, 300, false, 0, 50, 3.0f},  // decode, G = 8, a window and soft-capped scores
      {4, 4, 64, 1, 290, 320, false},               // decode, no GQA
      {8, 2, 128, 1, 300, 320, true},               // decode, head dim 128 (llama-3-8B, qwen3 heads)
      {4, 2, 256, 1, 270, 300, true, 0, 40},        // decode, head dim 256 with a window (gemma2-2B heads)
      {4, 2, 64, 9, 600, 640, false},               // prefill over ≥ 256 slots: attention_decode in query groups 4, 4, 1
      {8, 2, 128, 5, 300, 320, true},               // the same, head dim 128, NeoX
      {4, 2, 64, 12, 400, 420, false, 3, 64},       // prefill over a long prefix with a window and a position jump
      {4, 2, 64, 1, 2300, 2400, false, 5},          // decode over ≥ 2,048 slots: 128 entries per scores-pass lane
      {4, 2, 64, 1, 500, 512, false, 5, 64},        // decode, a window over a list whose positions jump (not logical)
  };
  // Every kernel: the GPUs' shared-memory tiles, the CPU drivers' one-slot-per-lane layout (head
  // dims ≤ 64; larger heads get Auto instead, which on a CPU driver takes attention_decode.comp
  // for a decode step over ≥ 256 slots with scratch, attention_lanes under 256) and their
  // one-row-per-lane layout (every case; it takes no splits, so it runs once per case).
  for (CacheType ct : {CacheType::F16, CacheType::Q8_0, CacheType::Q4_0})
    for (const AttnCase& c : cases) {
      for (bool split : {false, true})
        for (AttentionKernel k : {AttentionKernel::Tiled, AttentionKernel::Simd})
          check_attention(ct, c, split, k == AttentionKernel::Simd && c.head_dim > 64 ? AttentionKernel::Auto : k);
      check_attention(ct, c, false, AttentionKernel::Lanes);
    }
}

// The rotated copy of K: kv_store writes it, kv_rotate rebuilds the same bytes, and
// attention_decode reading it (no RoPE per entry, q rotated per block at the block's shift) gives
// the attention of the un-rotated cache, for every shape the decode kernel takes.
TEST_F(AttentionOps, DecodeFromTheRotatedCopyOfK) {
  const AttnCase cases[] = {
      {4, 2, 64, 1, 300, 512, false},               // decode over a long context
      {6, 2, 64, 1, 400, 512, true, 7},             // odd G, NeoX, a position jump
      {8, 1, 64, 1, 260, 300, false, 0, 50, 3.0f},  // G = 8, a window and soft-capped scores
      {8, 2, 128, 1, 300, 320, true},               // head dim 128
      {4, 2, 256, 1, 270, 300, true, 0, 40},        // head dim 256 with a window
      {4, 2, 64, 9, 600, 640, false},               // prefill over ≥ 256 slots, in query groups
      {4, 2, 64, 1, 576, 1024, false},              // the split (entry 192) on a block boundary
      {4, 2, 64, 1, 2300, 2400, true, 5},           // 128 entries per lane (≥ 2,048 slots), NeoX, a jump
      {4, 2, 64, 2, 4200, 4300, false},             // 256 entries per lane (≥ 4,096 slots), two queries
  };
  int ran = 0;
  for (const AttnCase& c : cases) {
    const AttentionShape shape{c.n_head, c.n_head_kv, c.head_dim, AttentionKernel::Simd};
    if (!decode_kernels_fit(test::vk(), shape, c.n_kv)) continue;
    check_attention(CacheType::F16, c, true, AttentionKernel::Simd, true);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << test::vk().info().name << " runs no attention_decode.comp (it needs 64-bit integers)";
}

// q and the lists bound at offsets into their buffers (a sequence's rows of a batched step, a
// window layer's suffix of the slot list), garbage before them: every kernel, and attention_decode
// with and without the rotated copy (it binds them from their buffers' start and adds the offsets).
TEST_F(AttentionOps, ListsAndQueriesAtOffsets) {
  const AttnCase cases[] = {
      {4, 2, 64, 1, 300, 512, false},      // decode over ≥ 256 slots
      {4, 2, 64, 9, 600, 640, true, 5},    // prefill over ≥ 256 slots, in query groups, NeoX, a jump
      {8, 4, 8, 3, 45, 64, true, 3},       // short lists (attention_simd, attention_lanes, the tiles)
  };
  for (const AttnCase& c : cases) {
    for (AttentionKernel k : {AttentionKernel::Tiled, AttentionKernel::Simd, AttentionKernel::Lanes})
      check_attention(CacheType::F16, c, true, k, false, true);
    check_attention(CacheType::Q8_0, c, true, AttentionKernel::Simd, false, true);
    if (decode_kernels_fit(test::vk(), AttentionShape{c.n_head, c.n_head_kv, c.head_dim, AttentionKernel::Simd}, c.n_kv))
      check_attention(CacheType::F16, c, true, AttentionKernel::Simd, true, true);
  }
}

// A per_query pass (a speculative verify pass) gives each of its tokens bit for bit what a pass of
// that token alone gives, as the engine builds both: positions are logical indices, the pass's
// tokens are the list's last entries, and with a window each list starts at its first token's
// window start rounded down to list_align (window_list_start), the pass's at its first token's.
// Every kernel (the GPUs' tiles, with and without split-KV scratch, in query groups; attention_simd;
// and what a CPU driver picks: lanes, the decode kernels, simd or the tiles by token).
struct AloneCase {
  uint32_t n_head, n_head_kv, head_dim, n_q, n_kv;
  uint32_t window = 0, list_align = 1;
  float softcap = 0.0f;
};

void check_alone(CacheType ct, const AloneCase& c, AttentionKernel kernel, bool split) {
  SCOPED_TRACE(std::string(cache_type_name(ct)) + " heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) +
               " hd " + std::to_string(c.head_dim) + " q " + std::to_string(c.n_q) + " kv " + std::to_string(c.n_kv) +
               " window " + std::to_string(c.window) + " align " + std::to_string(c.list_align) + (split ? " split" : "") +
               kernel_name(kernel));
  const uint32_t row_len = c.n_head_kv * c.head_dim, qd = c.n_head * c.head_dim, n_slots = c.n_kv + 7;
  std::mt19937 rng(c.n_kv * 7 + c.n_q);
  std::vector<int32_t> slots(n_slots);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(c.n_kv);
  const auto k_raw = test::random_floats(size_t(c.n_kv) * row_len, 11 + c.n_kv, -2, 2);
  const auto v_raw = test::random_floats(size_t(c.n_kv) * row_len, 12 + c.n_kv, -2, 2);
  const auto q = test::random_floats(size_t(c.n_q) * qd, 13 + c.n_q, -2, 2);
  // Entry e of the whole list is position e; token i of the pass is position n_kv − n_q + i.
  const auto list_start = [&](uint32_t pos) { return c.window && pos >= c.window ? (pos - c.window + 1) / c.list_align * c.list_align : 0; };
  const uint32_t p0 = c.n_kv - c.n_q;
  const RopeConfig rc{c.head_dim, c.head_dim, 10000.0f, 0.5f, false, {}};
  Buffer table(test::vk(), uint64_t{c.n_kv} * c.head_dim * 4, MemoryUse::Device, "rope table");
  Buffer dk_raw = test::to_device(k_raw), dv_raw = test::to_device(v_raw), dslots = test::to_device(slots);
  const uint64_t row_bytes = cache_row_bytes(ct, row_len);
  Buffer dkc = test::to_device(std::vector<uint8_t>(row_bytes * n_slots, 0)), dvc = test::to_device(std::vector<uint8_t>(row_bytes * n_slots, 0));
  AttentionShape shape{c.n_head, c.n_head_kv, c.head_dim, kernel, c.softcap > 0.0f ? 0.3f : 0.0f, c.softcap, c.window};
  shape.list_align = c.list_align;
  // Room for 4 tokens' partials or scores at once: a pass of more runs in groups.
  Buffer scratch(test::vk(), attention_scratch_floats(shape, c.n_kv, 4, 4) * 4, MemoryUse::Device, "attention scratch");
  {
    CommandRecorder rec(test::vk(), &test::pipelines());
    record_rope_table(rec, table.view(), c.n_kv, rc);
    record_kv_store(rec, ct, dk_raw.view(), row_len, dslots.view(), c.n_kv, row_len, dkc.view());
    record_kv_store(rec, ct, dv_raw.view(), row_len, dslots.view(), c.n_kv, row_len, dvc.view());
    rec.submit_and_wait();
  }
  // One pass's attention of q's tokens [first, first + n) over the list from entry `from`.
  const auto attend = [&](uint32_t first, uint32_t n, uint32_t from, bool per_query) {
    const uint32_t end = p0 + first + n;
    std::vector<int32_t> list(slots.begin() + from, slots.begin() + end), pos(end - from), q_pos(n);
    std::iota(pos.begin(), pos.end(), int32_t(from));
    std::iota(q_pos.begin(), q_pos.end(), int32_t(p0 + first));
    Buffer dq = test::to_device(std::vector<float>(q.begin() + size_t(first) * qd, q.begin() + size_t(first + n) * qd));
    Buffer dlist = test::to_device(list), dpos = test::to_device(pos), dqpos = test::to_device(q_pos);
    Buffer dout = test::to_device(std::vector<float>(size_t(n) * qd, 0.0f));
    AttentionShape s = shape;
    s.per_query = per_query;
    s.list_pos0 = from;
    CommandRecorder rec(test::vk(), &test::pipelines());
    record_attention(rec, ct, s, rc, table.view(), dq.view(), qd, dqpos.view(), n, dkc.view(), dvc.view(), dlist.view(),
                     dpos.view(), end - from, dout.view(), qd, split ? scratch.view() : BufferView{});
    rec.submit_and_wait();
    return test::from_device<float>(dout, size_t(n) * qd);
  };
  const std::vector<float> pass = attend(0, c.n_q, list_start(p0), true);
  for (uint32_t i = 0; i < c.n_q; ++i) {
    const std::vector<float> alone = attend(i, 1, list_start(p0 + i), false);
    size_t differ = 0;
    for (size_t e = 0; e < alone.size(); ++e) differ += pass[size_t(i) * qd + e] != alone[e];  // bit for bit
    EXPECT_EQ(differ, 0u) << "token " << i << " of the pass differs from its pass alone in " << differ << " of " << alone.size()
                          << " outputs (the first: " << pass[size_t(i) * qd] << " against " << alone[0] << ")";
  }
}

TEST_F(AttentionOps, PassTokensGetWhatTheyGetAlone) {
  const AloneCase cases[] = {
      {4, 2, 64, 9, 700},                 // long lists: splits, query groups of 4, 4, 1
      {8, 4, 8, 5, 300},                  // stories260K's heads past 256 slots (a CPU driver: simd)
      {4, 2, 64, 6, 260},                 // lists on both sides of 256 (lanes, then the decode kernels)
      {12, 2, 128, 4, 320},               // Qwen2-1.5B's heads (G × head dim 768: a CPU driver's tiles)
      {4, 2, 64, 7, 500, 300, 4},         // a window over 256 slots, lists starting on 4-entry boundaries
      {8, 4, 16, 5, 400, 100, 4, 2.0f},   // a window under 256 slots, soft-capped scores
      {6, 2, 64, 3, 450, 200, 1},         // a window ring's lists (any start)
      {8, 4, 8, 4, 130},                  // the first token's list takes one split, the last's two
  };
  for (const AloneCase& c : cases) {
    for (bool split : {false, true}) check_alone(CacheType::F16, c, AttentionKernel::Tiled, split);
    if (c.head_dim <= 64) check_alone(CacheType::F16, c, AttentionKernel::Simd, true);
    check_alone(CacheType::F16, c, AttentionKernel::Auto, true);
  }
  check_alone(CacheType::Q8_0, cases[0], AttentionKernel::Tiled, true);
  check_alone(CacheType::Q4_0, cases[2], AttentionKernel::Auto, true);
}

// Where a lone token's list past its window holds 254 to 257 entries (window 254, lists starting
// on 4-entry boundaries), a CPU driver would give a pass's tokens the lanes kernel (or, forced,
// attention_simd), another, then the first again: there alone a per_query pass is refused
// (speculation is off for such a model).
TEST_F(AttentionOps, PerQueryPassesRefusedOnlyWhereWindowListsStraddleTheLanesBound) {
  const bool cpu = test::vk().info().type == "cpu";
  AttentionShape s{4, 2, 64};
  EXPECT_TRUE(attention_per_query_exact(test::vk(), s, 64));
  s.window = 254;
  EXPECT_TRUE(attention_per_query_exact(test::vk(), s, 64));  // (a window ring's lists: any start)
  s.list_align = 4;
  EXPECT_EQ(attention_per_query_exact(test::vk(), s, 64), !cpu);
  s.kernel = AttentionKernel::Tiled;
  EXPECT_TRUE(attention_per_query_exact(test::vk(), s, 64));
  s.kernel = AttentionKernel::Simd;  // attention_simd under 256 slots, the decode kernels (where they run) from 256
  EXPECT_EQ(attention_per_query_exact(test::vk(), s, 64), !decode_kernels_fit(test::vk(), s, 256));
  s.kernel = AttentionKernel::Auto;
  s.window = 300;
  EXPECT_TRUE(attention_per_query_exact(test::vk(), s, 64));
}

}  // namespace
