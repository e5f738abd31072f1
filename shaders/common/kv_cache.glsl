// KV cache rows: one token's K (or V) for one layer is a row of n_head_kv · head_dim elements in
// the cache type, stored at its slot: f16, or ggml's q8_0 / q4_0 blocks of 32 along the row.
// Define one CACHE_F16 / CACHE_Q8_0 / CACHE_Q4_0 before including.
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require

#if defined(CACHE_F16)
uint cache_row_bytes(uint n) { return 2 * n; }
#elif defined(CACHE_Q8_0)
uint cache_row_bytes(uint n) { return n / 32 * 34; }  // f16 d; i8 q[32]
#elif defined(CACHE_Q4_0)
uint cache_row_bytes(uint n) { return n / 32 * 18; }  // f16 d; u8 q[16]: j < 16 low nibble, j ≥ 16 high nibble of q[j-16]
#else
#error "define CACHE_F16, CACHE_Q8_0 or CACHE_Q4_0"
#endif

// Declares readonly byte, u16 and u32 views of a cache binding and `float NAME_at(row_base, e)`:
// element e of the row starting at byte row_base.
#define CACHE_READER(NAME, BINDING)                                                          \
  layout(binding = BINDING) readonly buffer NAME##_u8_block { uint8_t NAME##_u8[]; };       \
  layout(binding = BINDING) readonly buffer NAME##_u16_block { uint16_t NAME##_u16[]; };    \
  layout(binding = BINDING) readonly buffer NAME##_u32_block { uint NAME##_u32[]; };        \
  float NAME##_at(uint row_base, uint e) { return CACHE_ELEMENT(NAME##_u8, NAME##_u16, row_base, e); }

#define CACHE_F16_AT(b, row_base) unpackHalf2x16(uint(b[(row_base) >> 1])).x
#if defined(CACHE_F16)
#define CACHE_ELEMENT(u8, u16, row_base, e) CACHE_F16_AT(u16, (row_base) + 2 * (e))
#elif defined(CACHE_Q8_0)
#define CACHE_ELEMENT(u8, u16, row_base, e) \
  (CACHE_F16_AT(u16, (row_base) + ((e) / 32) * 34) * float(int8_t(u8[(row_base) + ((e) / 32) * 34 + 2 + (e) % 32])))
#elif defined(CACHE_Q4_0)
#define CACHE_ELEMENT(u8, u16, row_base, e)                                                              \
  (CACHE_F16_AT(u16, (row_base) + ((e) / 32) * 18) *                                                    \
   (float((uint(u8[(row_base) + ((e) / 32) * 18 + 2 + (e) % 16]) >> (((e) % 32) >= 16 ? 4 : 0)) & 0xFu) - 8.0))
#endif

// CACHE_RUN_READER(NAME, BINDING) declares what CACHE_LOAD_RUN(NAME, row_base, e0, n, dst) reads:
// n elements of a row from element e0 into dst. f16: the binding is a storage texel buffer of
// 16-byte texels, eight halves per load (n and e0 multiples of 8, rows 16-byte aligned); lavapipe
// serves a texel load several times faster than storage-buffer loads of the same bytes
// (docs/performance.md, "Texel loads"). q8_0 / q4_0: word loads per block (CACHE_READER).
// (A kernel that reads its caches otherwise defines CACHE_TEXEL(NAME, i), texel i of NAME's.)
#if defined(CACHE_F16)
#define CACHE_RUN_READER(NAME, BINDING) \
  layout(binding = BINDING, rgba32ui) uniform readonly restrict uimageBuffer NAME##_tex;
#if !defined(CACHE_TEXEL)
#define CACHE_TEXEL(NAME, i) imageLoad(NAME##_tex, i)
#endif
#define CACHE_LOAD_RUN(NAME, row_base, e0, n, dst)                                          \
  [[unroll]] for (uint t = 0; t < (n) / 8; ++t) {                                           \
    const uvec4 w = CACHE_TEXEL(NAME, int(((row_base) + 2 * (e0) + 16 * t) >> 4));         \
    const vec2 h0 = unpackHalf2x16(w.x), h1 = unpackHalf2x16(w.y);                          \
    const vec2 h2 = unpackHalf2x16(w.z), h3 = unpackHalf2x16(w.w);                          \
    dst[8 * t] = h0.x; dst[8 * t + 1] = h0.y; dst[8 * t + 2] = h1.x; dst[8 * t + 3] = h1.y; \
    dst[8 * t + 4] = h2.x; dst[8 * t + 5] = h2.y; dst[8 * t + 6] = h3.x; dst[8 * t + 7] = h3.y; \
  }
#elif defined(CACHE_Q8_0) || defined(CACHE_Q4_0)
#define CACHE_RUN_READER(NAME, BINDING) CACHE_READER(NAME, BINDING)
// Runs of whole 32-element blocks (34 / 18 bytes, 2-byte aligned) are read as the 32-bit words
// covering each block, realigned by 16 bits when the block starts mid-word: 9 (Q8_0) or 5 (Q4_0)
// loads per block instead of two per element, the scale once per block. The last word of a block
// that starts on a word is read as 16 bits, so no load reaches past the block's last byte (the
// word before a mid-word block is inside the buffer). Other runs go element by element.
#if defined(CACHE_Q8_0)
#define CACHE_BLOCK_BYTES 34
#define CACHE_BLOCK_WORDS 9
#define CACHE_DECODE_BLOCK(a, d, dst, o)                                                              \
  [[unroll]] for (uint j_ = 0; j_ < 32; ++j_)                                                         \
    dst[(o) + j_] = (d) * float(int(a[(2 + j_) >> 2] << (24 - 8 * ((2 + j_) & 3u))) >> 24);
#else
#define CACHE_BLOCK_BYTES 18
#define CACHE_BLOCK_WORDS 5
#define CACHE_DECODE_BLOCK(a, d, dst, o)                                                              \
  [[unroll]] for (uint j_ = 0; j_ < 16; ++j_) {                                                       \
    const uint q_ = (a[(2 + j_) >> 2] >> (8 * ((2 + j_) & 3u))) & 0xFFu;                              \
    dst[(o) + j_] = (d) * (float(q_ & 0xFu) - 8.0);                                                   \
    dst[(o) + 16 + j_] = (d) * (float(q_ >> 4) - 8.0);                                                \
  }
#endif
#define CACHE_LOAD_RUN(NAME, row_base, e0, n, dst)                                                    \
  if ((e0) % 32 == 0 && (n) % 32 == 0) {                                                              \
    [[unroll]] for (uint blk_ = 0; blk_ < (n) / 32; ++blk_) {                                         \
      const uint b_ = (row_base) + ((e0) / 32 + blk_) * CACHE_BLOCK_BYTES, w_ = b_ >> 2;              \
      const bool mid_ = (b_ & 2u) != 0;                                                               \
      uint a_[CACHE_BLOCK_WORDS], x_[CACHE_BLOCK_WORDS];                                              \
      [[unroll]] for (uint i_ = 0; i_ + 1 < CACHE_BLOCK_WORDS; ++i_) x_[i_] = NAME##_u32[w_ + i_];    \
      x_[CACHE_BLOCK_WORDS - 1] = mid_ ? NAME##_u32[w_ + CACHE_BLOCK_WORDS - 1]                       \
                                       : uint(NAME##_u16[(b_ + 4 * (CACHE_BLOCK_WORDS - 1)) >> 1]);   \
      [[unroll]] for (uint i_ = 0; i_ + 1 < CACHE_BLOCK_WORDS; ++i_)                                  \
        a_[i_] = mid_ ? (x_[i_] >> 16) | (x_[i_ + 1] << 16) : x_[i_];                                 \
      a_[CACHE_BLOCK_WORDS - 1] = mid_ ? x_[CACHE_BLOCK_WORDS - 1] >> 16 : x_[CACHE_BLOCK_WORDS - 1]; \
      const float d_ = unpackHalf2x16(a_[0]).x;                                                       \
      CACHE_DECODE_BLOCK(a_, d_, dst, 32 * blk_)                                                      \
    }                                                                                                 \
  } else {                                                                                            \
    [[unroll]] for (uint t = 0; t < (n); ++t) dst[t] = NAME##_at(row_base, (e0) + t);                 \
  }
#endif
