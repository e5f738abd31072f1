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

// For kernels that enable 64-bit integers: a u64vec2 view of a cache binding, and
// CACHE_LOAD_RUN(NAME, row_base, e0, n, dst): n elements of a row from element e0 into dst
// (f16: eight per 128-bit load, so n and e0 multiples of 8; other types element by element).
#define CACHE_WIDE_VIEW(NAME, BINDING) \
  layout(binding = BINDING) readonly buffer NAME##_u64x2_block { u64vec2 NAME##_u64x2[]; };
#if defined(CACHE_F16)
#define CACHE_LOAD_RUN(NAME, row_base, e0, n, dst)                                          \
  [[unroll]] for (uint t = 0; t < (n) / 8; ++t) {                                           \
    const u64vec2 w = NAME##_u64x2[((row_base) + 2 * (e0) + 16 * t) >> 4];                  \
    const uvec2 a = unpackUint2x32(w.x), b = unpackUint2x32(w.y);                           \
    const vec2 h0 = unpackHalf2x16(a.x), h1 = unpackHalf2x16(a.y);                          \
    const vec2 h2 = unpackHalf2x16(b.x), h3 = unpackHalf2x16(b.y);                          \
    dst[8 * t] = h0.x; dst[8 * t + 1] = h0.y; dst[8 * t + 2] = h1.x; dst[8 * t + 3] = h1.y; \
    dst[8 * t + 4] = h2.x; dst[8 * t + 5] = h2.y; dst[8 * t + 6] = h3.x; dst[8 * t + 7] = h3.y; \
  }
#else
#define CACHE_LOAD_RUN(NAME, row_base, e0, n, dst) \
  [[unroll]] for (uint t = 0; t < (n); ++t) dst[t] = NAME##_at(row_base, (e0) + t);
#endif
