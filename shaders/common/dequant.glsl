// Weight dequantization for every weight type vkllm runs, block layouts exactly as ggml's
// ggml-common.h. The including shader defines WEIGHT_BINDING and one WTYPE_* macro; this file
// declares the weight buffer (aliased as bytes, u16 and f32) and provides
//
//   QK, BLOCK_BYTES                    elements and bytes per block
//   void dq8(uint base, uint j8, uint n_valid, out float v[8])
//       elements j8 … j8+7 (j8 a multiple of 8, < QK) of the block starting at byte `base`.
//       For the plain types (QK = 1) `base` is the first element's byte and only the first
//       n_valid elements are read (rows need not be a multiple of 8); the rest are 0.
//   void dq_offsets(uint row_base, uint k, out uint base, out uint j8)
//       where element k (a multiple of 8) of the row starting at byte row_base lives.
//
// Every 8-run lies inside one sub-block, so scales are decoded once per call, and its quantized
// bytes are read as two words (run8).
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require

layout(binding = WEIGHT_BINDING) readonly buffer WeightU8 { uint8_t w8[]; };
layout(binding = WEIGHT_BINDING) readonly buffer WeightU16 { uint16_t w16[]; };
layout(binding = WEIGHT_BINDING) readonly buffer WeightF32 { float w32[]; };

uint wb(uint byte_index) { return uint(w8[byte_index]); }
// The 4 bytes at byte o (o even; blocks start on even bytes) as one word, from two 16-bit loads.
uint word_at(uint o) { return uint(w16[o >> 1]) | (uint(w16[(o >> 1) + 1]) << 16); }
// The 8 bytes at byte o (o even: every run dq8 reads starts on an even byte) as two words, from
// four 16-bit loads instead of eight byte loads; byte i of the run is run_byte(r, i).
uvec2 run8(uint o) { return uvec2(word_at(o), word_at(o + 4)); }
// Byte b (0…3) of word q.
uint byte_of(uint q, uint b) { return (q >> (8u * b)) & 0xFFu; }
uint run_byte(uvec2 r, uint i) { return byte_of(i < 4 ? r.x : r.y, i & 3u); }
// f16 at an even byte offset.
float wf16(uint byte_index) { return unpackHalf2x16(uint(w16[byte_index >> 1])).x; }

#if defined(WTYPE_F32)
#define QK 1
#define BLOCK_BYTES 4
#elif defined(WTYPE_F16) || defined(WTYPE_BF16)
#define QK 1
#define BLOCK_BYTES 2
#elif defined(WTYPE_Q4_0)
#define QK 32
#define BLOCK_BYTES 18   // f16 d; u8 qs[16]: element j < 16 low nibble of qs[j], j ≥ 16 high nibble of qs[j-16]
#elif defined(WTYPE_Q4_1)
#define QK 32
#define BLOCK_BYTES 20   // f16 d, m; u8 qs[16]
#elif defined(WTYPE_Q5_0)
#define QK 32
#define BLOCK_BYTES 22   // f16 d; u8 qh[4] (bit j = 5th bit of element j); u8 qs[16]
#elif defined(WTYPE_Q5_1)
#define QK 32
#define BLOCK_BYTES 24   // f16 d, m; u8 qh[4]; u8 qs[16]
#elif defined(WTYPE_Q8_0)
#define QK 32
#define BLOCK_BYTES 34   // f16 d; i8 qs[32]
#elif defined(WTYPE_Q2_K)
#define QK 256
#define BLOCK_BYTES 84   // u8 scales[16] (lo 4 bits scale, hi 4 bits min); u8 qs[64]; f16 d, dmin
#elif defined(WTYPE_Q3_K)
#define QK 256
#define BLOCK_BYTES 110  // u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 × 6 bits); f16 d
#elif defined(WTYPE_Q4_K)
#define QK 256
#define BLOCK_BYTES 144  // f16 d, dmin; u8 scales[12] (8 × 6-bit scale and min); u8 qs[128]
#elif defined(WTYPE_Q5_K)
#define QK 256
#define BLOCK_BYTES 176  // f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
#elif defined(WTYPE_Q6_K)
#define QK 256
#define BLOCK_BYTES 210  // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
#elif defined(WTYPE_IQ4_NL)
#define QK 32
#define BLOCK_BYTES 18   // f16 d; u8 qs[16] laid out as Q4_0's, each nibble an index into KVALUES_IQ4
#elif defined(WTYPE_IQ4_XS)
#define QK 256
#define BLOCK_BYTES 136  // f16 d; u16 scales_h (2 high bits of 8 6-bit scales); u8 scales_l[4] (4 low bits); u8 qs[128]
#else
#error "define one WTYPE_*"
#endif

#if defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
// The non-linear 4-bit codebook of ggml's IQ4_NL and IQ4_XS.
const float KVALUES_IQ4[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                        1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
#endif

void dq_offsets(uint row_base, uint k, out uint base, out uint j8) {
  base = row_base + (k / QK) * BLOCK_BYTES;
  j8 = k % QK;
}

// The 6-bit scale and min of sub-block j (0…7) of a Q4_K/Q5_K super-block, from the three words
// s0, s1, s2 of its 12 scale bytes.
void scale_min_words(uint s0, uint s1, uint s2, uint j, out float sc, out float mn) {
  if (j < 4) {
    sc = float(byte_of(s0, j) & 63u);
    mn = float(byte_of(s1, j) & 63u);
  } else {
    const uint b = byte_of(s2, j - 4);
    sc = float((b & 0xFu) | ((byte_of(s0, j - 4) >> 6) << 4));
    mn = float((b >> 4) | ((byte_of(s1, j - 4) >> 6) << 4));
  }
}

// The same for a block whose scales start at byte `s` (even).
void scale_min_k4(uint s, uint j, out float sc, out float mn) {
  scale_min_words(word_at(s), word_at(s + 4), word_at(s + 8), j, sc, mn);
}

void dq8(uint base, uint j8, uint n_valid, out float v[8]) {
#if defined(WTYPE_F32)
  for (uint i = 0; i < 8; ++i) v[i] = i < n_valid ? w32[(base >> 2) + i] : 0.0;
#elif defined(WTYPE_F16)
  for (uint i = 0; i < 8; ++i) v[i] = i < n_valid ? wf16(base + 2 * i) : 0.0;
#elif defined(WTYPE_BF16)
  for (uint i = 0; i < 8; ++i) v[i] = i < n_valid ? uintBitsToFloat(uint(w16[(base >> 1) + i]) << 16) : 0.0;
#elif defined(WTYPE_Q4_0)
  const float d = wf16(base);
  const uint shift = j8 >= 16 ? 4 : 0;
  const uvec2 q = run8(base + 2 + (j8 & 15));
  for (uint i = 0; i < 8; ++i) v[i] = (float((run_byte(q, i) >> shift) & 0xFu) - 8.0) * d;
#elif defined(WTYPE_Q4_1)
  const float d = wf16(base), m = wf16(base + 2);
  const uint shift = j8 >= 16 ? 4 : 0;
  const uvec2 q = run8(base + 4 + (j8 & 15));
  for (uint i = 0; i < 8; ++i) v[i] = float((run_byte(q, i) >> shift) & 0xFu) * d + m;
#elif defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
#if defined(WTYPE_Q5_0)
  const float d = wf16(base), m = -16.0 * d;
  const uint qh_at = base + 2;
#else
  const float d = wf16(base), m = wf16(base + 2);
  const uint qh_at = base + 4;
#endif
  const uint qh = word_at(qh_at);
  const uint shift = j8 >= 16 ? 4 : 0;
  const uvec2 qs = run8(qh_at + 4 + (j8 & 15));
  for (uint i = 0; i < 8; ++i) {
    const uint j = j8 + i;
    const uint q = ((run_byte(qs, i) >> shift) & 0xFu) | (((qh >> j) & 1u) << 4);
    v[i] = float(q) * d + m;
  }
#elif defined(WTYPE_Q8_0)
  const float d = wf16(base);
  const uvec2 q = run8(base + 2 + j8);
  for (uint i = 0; i < 8; ++i) v[i] = float(int(run_byte(q, i) << 24) >> 24) * d;
#elif defined(WTYPE_Q2_K)
  // Element e: half n = e/128, r = e%128, j = r/32, l = r%32; 2 bits at shift 2j of qs[32n + l];
  // scale byte 8n + 2j + l/16.
  const uint n = j8 / 128, r = j8 % 128, j = r / 32, l = r % 32;
  const float d = wf16(base + 80), dmin = wf16(base + 82);
  const uint sc = wb(base + 8 * n + 2 * j + l / 16);
  const float dl = d * float(sc & 0xFu), ml = dmin * float(sc >> 4);
  const uvec2 q = run8(base + 16 + 32 * n + l);
  for (uint i = 0; i < 8; ++i) v[i] = dl * float((run_byte(q, i) >> (2 * j)) & 3u) - ml;
#elif defined(WTYPE_Q3_K)
  // Like Q2_K, plus a high bit from hmask[l] bit (4n + j) that, when clear, subtracts 4; scales are
  // 6-bit: low 4 bits from byte i (i < 8) or the high nibble of byte i-8, top 2 bits from byte
  // 8 + i%4 at shift 2*(i/4); value − 32.
  const uint n = j8 / 128, r = j8 % 128, j = r / 32, l = r % 32;
  const uint is = 8 * n + 2 * j + l / 16;
  const uint s = base + 96;
  const uint lo = is < 8 ? (wb(s + is) & 0xFu) : (wb(s + is - 8) >> 4);
  const uint hi = (wb(s + 8 + is % 4) >> (2 * (is / 4))) & 3u;
  const float dl = wf16(base + 108) * (float(lo | (hi << 4)) - 32.0);
  const uint m = 1u << (4 * n + j);
  const uvec2 qs = run8(base + 32 + 32 * n + l), hm = run8(base + l);
  for (uint i = 0; i < 8; ++i) {
    const int q = int((run_byte(qs, i) >> (2 * j)) & 3u) - ((run_byte(hm, i) & m) != 0 ? 0 : 4);
    v[i] = dl * float(q);
  }
#elif defined(WTYPE_Q4_K)
  // Element e: chunk c = e/64, r = e%64; low nibble (r < 32, scale 2c) or high nibble (scale
  // 2c+1) of qs[32c + r%32].
  const uint c = j8 / 64, r = j8 % 64;
  float sc, mn;
  scale_min_k4(base + 4, 2 * c + r / 32, sc, mn);
  const float d = wf16(base) * sc, m = wf16(base + 2) * mn;
  const uint shift = r >= 32 ? 4 : 0;
  const uvec2 q = run8(base + 16 + 32 * c + (r & 31));
  for (uint i = 0; i < 8; ++i) v[i] = d * float((run_byte(q, i) >> shift) & 0xFu) - m;
#elif defined(WTYPE_Q5_K)
  // As Q4_K with a 5th bit from qh[r%32] bit (2c + r/32).
  const uint c = j8 / 64, r = j8 % 64;
  float sc, mn;
  scale_min_k4(base + 4, 2 * c + r / 32, sc, mn);
  const float d = wf16(base) * sc, m = wf16(base + 2) * mn;
  const uint shift = r >= 32 ? 4 : 0;
  const uint hbit = 2 * c + r / 32;
  const uvec2 qs = run8(base + 48 + 32 * c + (r & 31)), qh = run8(base + 16 + (r & 31));
  for (uint i = 0; i < 8; ++i) {
    const uint q = ((run_byte(qs, i) >> shift) & 0xFu) | (((run_byte(qh, i) >> hbit) & 1u) << 4);
    v[i] = d * float(q) - m;
  }
#elif defined(WTYPE_Q6_K)
  // Element e: n = e/128, r = e%128, k = r/32, l = r%32; 4 low bits: nibble (k ≥ 2: high) of
  // ql[64n + l + 32(k&1)]; 2 high bits: qh[32n + l] at shift 2k; scale sc[8n + l/16 + 2k]; −32.
  const uint n = j8 / 128, r = j8 % 128, k = r / 32, l = r % 32;
  const float d = wf16(base + 208) * float(int8_t(w8[base + 192 + 8 * n + l / 16 + 2 * k]));
  const uint shift = k >= 2 ? 4 : 0;
  const uvec2 ql = run8(base + 64 * n + l + 32 * (k & 1)), qh = run8(base + 128 + 32 * n + l);
  for (uint i = 0; i < 8; ++i) {
    const uint lo = (run_byte(ql, i) >> shift) & 0xFu;
    const uint hi = (run_byte(qh, i) >> (2 * k)) & 3u;
    v[i] = d * float(int(lo | (hi << 4)) - 32);
  }
#elif defined(WTYPE_IQ4_NL)
  const float d = wf16(base);
  const uint shift = j8 >= 16 ? 4 : 0;
  const uvec2 q = run8(base + 2 + (j8 & 15));
  for (uint i = 0; i < 8; ++i) v[i] = d * KVALUES_IQ4[(run_byte(q, i) >> shift) & 0xFu];
#elif defined(WTYPE_IQ4_XS)
  // Sub-block ib = e/32: scale (4 low bits of scales_l[ib/2] at shift 4(ib%2), 2 high bits of
  // scales_h at shift 2ib) − 32; its 16 bytes of qs laid out as IQ4_NL's.
  const uint ib = j8 / 32, r = j8 % 32;
  const uint ls = ((wb(base + 4 + ib / 2) >> (4 * (ib % 2))) & 0xFu) | (((uint(w16[(base + 2) >> 1]) >> (2 * ib)) & 3u) << 4);
  const float dl = wf16(base) * (float(ls) - 32.0);
  const uint shift = r >= 16 ? 4 : 0;
  const uvec2 q = run8(base + 8 + 16 * ib + (r & 15));
  for (uint i = 0; i < 8; ++i) v[i] = dl * KVALUES_IQ4[(run_byte(q, i) >> shift) & 0xFu];
#endif
}
