// matvec_simd: y[dest(r, c)] (+)= W[r] · x_c for COLS activation columns (a decode
// step of several sequences, or a slice of a prefill chunk), every weight type, laid out
// for CPU drivers (lavapipe), where every load whose address differs per lane is a scalar loop
// over the lanes and costs per component, and the lanes of a subgroup are the SIMD width. The host
// dispatches it once per k_simd_cols columns (a prefill chunk reads the weights once per group).
//
// A workgroup is one subgroup and owns p.rows_per_group consecutive rows. A row is cut into units
// of 256 elements (8 blocks of the 32-element types, one K-quant super-block, 256 plain values),
// and lane l owns units l, l + S, l + 2S, … (UPL of them, S = subgroup size). So each lane:
//   - loads its slice of every column's x once (vec4 loads; the x64 variant as 16-byte texels, a
//     column at a time), with each block's sum of x, and keeps them in registers (or the stack,
//     for long rows) for all its rows;
//   - reads each weight byte once for all columns as 16-byte texels (binding 0 a storage texel
//     buffer), realigned in registers for the units that are not a multiple of 16 bytes; the
//     unit's bytes are then unpacked in registers at constant offsets (every loop but the row
//     loop is unrolled);
//   - applies each block's scale once per block (offsets and mins through the block's sum of x;
//     Q4_1/Q4_K nibbles masked in place against an x pre-scaled by their bit position; Q4_0 in
//     integers against x rounded to 9 bits, below);
//   - decodes each weight once and multiplies it into every column (the column loop innermost);
// and one subgroupAdd per row (the columns' sums four to a vec4) reduces the lanes; lane j keeps row j
// of every W rows and the W rows are stored together (below). No shared memory, no barriers.
// Where rows go and the gated activation of a fused gate|up projection: common/matmul_out.glsl
// (with glu a row is done twice, for the gate row and for the up row, through the same code).
// The host uses it when cols % 256 == 0 and every row starts on a 16-byte (Q2_K, Q3_K, Q6_K, IQ4_XS:
// 4-byte) boundary.
// Bindings: 0 W [rows][row_bytes] (weight type, as rgba32ui texels; the bound range a whole
// number of them), 1 x [n_tokens][x_stride] f32 (the x64 variant: its whole buffer as rgba32ui
// texels, column 0 at p.x_base), 2 y f32.
// Specialization: 0 workgroup size (= subgroup size), 1 UPL (units per lane), 2 COLS (columns per
// dispatch; n_tokens ≤ COLS of them are live). The rows per workgroup are a push constant, so the
// host's choice per matrix and machine costs no pipeline variant.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#if defined(X64_QUADS)
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#endif
#include "params.h"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint UPL = 1;
layout(constant_id = 2) const uint COLS = 1;
#if defined(X64_QUADS)
// x as 16-byte texels (rgba32ui) from p.x_base: a per-lane texel load is one wide load per lane on
// lavapipe, a storage-buffer vec4 a loop over the lanes per component (below, the prologue).
layout(binding = 1, rgba32ui) uniform readonly restrict uimageBuffer x_tex;
#else
layout(binding = 1) readonly buffer X { vec4 x4[]; };
#endif
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { MatmulParams p; };
#include "matmul_out.glsl"

#define UNIT 256          // elements per unit
#define XV (UNIT / 4)     // vec4 of x per unit

#if defined(WTYPE_F32)
#define UNIT_BYTES 1024   // 256 × f32
#define SUBS 1
#elif defined(WTYPE_F16) || defined(WTYPE_BF16)
#define UNIT_BYTES 512    // 256 × f16 / bf16
#define SUBS 1
#elif defined(WTYPE_Q4_0)
#define UNIT_BYTES 144    // 8 × { f16 d; u8 qs[16] }
#define SUBS 8            // blocks (x sums) per unit
#elif defined(WTYPE_Q4_1)
#define UNIT_BYTES 160    // 8 × { f16 d, m; u8 qs[16] }
#define SUBS 8
#elif defined(WTYPE_Q5_0)
#define UNIT_BYTES 176    // 8 × { f16 d; u8 qh[4]; u8 qs[16] }
#define SUBS 8
#elif defined(WTYPE_Q5_1)
#define UNIT_BYTES 192    // 8 × { f16 d, m; u8 qh[4]; u8 qs[16] }
#define SUBS 8
#elif defined(WTYPE_Q8_0)
#define UNIT_BYTES 272    // 8 × { f16 d; i8 qs[32] }
#define SUBS 8
#elif defined(WTYPE_Q2_K)
#define UNIT_BYTES 84     // u8 scales[16]; u8 qs[64]; f16 d, dmin
#define SUBS 16
#elif defined(WTYPE_Q3_K)
#define UNIT_BYTES 110    // u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d
#define SUBS 16
#elif defined(WTYPE_Q4_K)
#define UNIT_BYTES 144    // f16 d, dmin; u8 scales[12]; u8 qs[128]
#define SUBS 8
#elif defined(WTYPE_Q5_K)
#define UNIT_BYTES 176    // f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
#define SUBS 8
#elif defined(WTYPE_Q6_K)
#define UNIT_BYTES 210    // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
#define SUBS 16
#elif defined(WTYPE_IQ4_NL)
#define UNIT_BYTES 144    // 8 × { f16 d; u8 qs[16] } (Q4_0's layout, nibbles index the codebook)
#define SUBS 1            // no offsets: the block sums are not needed
#elif defined(WTYPE_IQ4_XS)
#define UNIT_BYTES 136    // f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]
#define SUBS 1
#else
#error "matvec_simd: define one WTYPE_*"
#endif
// Units of a multiple of 16 bytes are read as whole 16-byte texels; the others (Q2_K: 84, Q3_K:
// 110, Q6_K: 210, IQ4_XS: 136 bytes) as the texels covering them, realigned.
#define WIDE_UNITS (UNIT_BYTES % 16 == 0)
#define UNIT_WORDS ((UNIT_BYTES + 3) / 4)

// Units are read as 16-byte texels of a storage texel buffer: lavapipe serves a per-lane texel
// load (one uvec4) several times faster than the same bytes through storage-buffer loads, which it
// splits into per-lane scalar loads per component (docs/shaders.md, "Texel loads"). A 144-byte
// unit is 9 loads; the others are realigned in registers (load_unit).
layout(binding = 0, rgba32ui) uniform readonly restrict uimageBuffer wtex;

#if defined(WTYPE_Q4_0)
// Q4_0 multiplies integers, two columns per multiply: each 32-element block of x is quantized to
// 9 bits (±255, scale max|x|/255, rounded to even), and a block's Σ (q − 8)·x9 is summed in 32-bit
// integers with column 2p's x9 in the low 16 bits and column 2p + 1's above. A sum of 16 such
// products stays within ±16·8·255 < 2^15, so with each field biased by 2^15 it ends in [0, 2^16)
// and the two halves come apart exactly by masks (the low and high nibbles' sums are then added
// in 32 bits, where they cannot overflow into each other), every column's integer sum is exact
// whatever COLS is (batch invariance), and one multiply-add serves two columns. (llama.cpp's CPU
// backend rounds x to 8 bits for its Q4_0 products; 9 bits halve that error.) The nibbles are
// multiplied unsigned and the −8 applied once per half block, as 8 times its packed sum of x9:
// the packed arithmetic is exact modulo 2^32 (the halves may carry into each other on the way,
// never in the end, where each is the bounded sum above). docs/performance.md, "Four sequences
// per step".
// X64_QUADS (the variant matvec_simd_q4_0_x64, for hosts where a 64-bit multiply over the lanes is
// one instruction): four columns per 64-bit integer, column 4p + f in the 16-bit field f, and the
// nibbles decoded from 64-bit words; the fields come apart as the halves do, into the same
// integers as with pairs, so results are bit for bit those of the 32-bit packing. Per weight: a
// shift, a mask, a multiply and an add for four columns, against a shift, a mask and two
// multiply-adds (docs/performance.md, "Four columns per 64-bit multiply").
#define INT_X 1
#define X_LEVELS 255.0
#if defined(X64_QUADS)
#define FIELDS 4          // columns per packed integer
#define xint int64_t
#define FIELD_BIAS int64_t(0x8000800080008000ul)
#define FIELD_MASK int64_t(0x0000FFFF0000FFFFul)
#else
#define FIELDS 2
#define xint int
#define FIELD_BIAS int(0x80008000u)
#define FIELD_MASK 0xFFFF
#endif
#define PACKS ((COLS + FIELDS - 1) / FIELDS)
// xq: x9 of columns 2p, 2p + 1 (times 2^16), or 4p … 4p + 3 (4p + f times 2^16f); in each block the
// upper 16 elements (the high nibbles') hold x9[16 + j] − 16·x9[j] instead (below).
xint xq[PACKS][UPL][UNIT];
xint xqh[PACKS][UPL][16];      // Σ x9 over each half block's 16 elements: [2b] bytes 0–7 (both nibbles), [2b + 1] bytes 8–15
#if defined(X64_QUADS)
vec4 xd4[UPL][8];              // each block's x scale, column c in component c (COLS is 4)
#define XD(c, u, b) xd4[u][b][c]
#else
float xd[COLS][UPL][8];        // each block's x scale
#define XD(c, u, b) xd[c][u][b]
#endif
#else
float xs[COLS][UPL][UNIT];     // this lane's x slices, per column (scaled by xs_scale)
float xsum[COLS][UPL][SUBS];   // sum of x over each block (sub-block for the K-quants)
#endif
uint wd[UNIT_WORDS + 1];       // one unit's bytes, as words

// Byte o of the unit (o a constant after unrolling).
uint ub(uint o) { return (wd[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu; }
// The 4 bytes o … o+3 (o even) as one word.
uint uw(uint o) { return (o & 3u) == 0 ? wd[o >> 2] : (wd[o >> 2] >> 16) | (wd[(o >> 2) + 1] << 16); }
// f16 at byte o (o even).
float uh(uint o) { return unpackHalf2x16(wd[o >> 2] >> ((o & 2u) * 8u)).x; }
// Conversions go through int: x86 has a vector int→float instruction, not an unsigned one.
// Nibble-packed types are read without shifts: the nibble at bit `sh` of word q is masked in place,
// converted, and multiplied by an x that was scaled by 2^-sh when it was loaded (xs_scale). The
// top nibble (sh = 28) is shifted down instead, as int conversion needs values below 2^31.
float nib_at(uint q, uint sh) { return sh == 28 ? float(int(q >> 28)) : float(int(q & (0xFu << sh))); }
// IQ4_NL / IQ4_XS: the codebook value of nibble n, from four words of four signed bytes each
// (ggml's kvalues_iq4nl: −127 −104 −83 −65 | −49 −35 −22 −10 | 1 13 25 38 | 53 69 89 113), the
// word chosen by two selects, so no per-lane indexed load.
float iq4_value(uint n) {
  const uint w = (n & 8u) != 0 ? ((n & 4u) != 0 ? 0x71594535u : 0x26190D01u) : ((n & 4u) != 0 ? 0xF6EADDCFu : 0xBFAD9881u);
  return float(int(w << (24u - 8u * (n & 3u))) >> 24);
}
// The 4 signed bytes of word q.
vec4 i8x4(uint q) { return vec4((ivec4(q) << ivec4(24, 16, 8, 0)) >> 24); }

// The factor element e of a unit's x is stored with: 2^-sh for the nibble at bit sh it multiplies.
float xs_scale(uint e) {
#if defined(WTYPE_Q4_1)
  const uint b = e / 32, j = e % 16, at = 20 * b + 4 + j, sh = 8 * (at & 3u) + (e % 32 >= 16 ? 4 : 0);
  return sh == 28 ? 1.0 : exp2(-float(sh));
#elif defined(WTYPE_Q4_K)
  const uint j = e / 32, r = e % 32, at = 16 + 32 * (j / 2) + r, sh = 8 * (at & 3u) + 4 * (j & 1u);
  return sh == 28 ? 1.0 : exp2(-float(sh));
#else
  return 1.0;
#endif
}
#if !INT_X
vec4 x4_at(uint c, uint u, uint e) { return vec4(xs[c][u][e], xs[c][u][e + 1], xs[c][u][e + 2], xs[c][u][e + 3]); }
#endif

// Loads the unit starting at byte `at` into wd.
void load_unit(uint at) {
#if WIDE_UNITS
  const int first = int(at / 16);
  [[unroll]] for (uint i = 0; i < UNIT_BYTES / 16; ++i) {
    const uvec4 v = imageLoad(wtex, first + int(i));
    [[unroll]] for (uint k = 0; k < 4; ++k) wd[4 * i + k] = v[k];
  }
#else
  // 84-, 110-, 136- and 210-byte units start anywhere on a 2-byte boundary: load the NT texels
  // that can cover one (clamped to the binding: the host pads the bound range to whole texels),
  // then pick word i + k of them, k = the unit's word within its first texel, by selects (an
  // index that differs per lane would go through memory), shifted by 16 bits when it starts
  // mid-word.
  const uint NT = (UNIT_BYTES + 14 + 15) / 16;
  const int t0 = int(at >> 4), last = imageSize(wtex) - 1;
  uint r[4 * NT + 4];
  [[unroll]] for (uint i = 0; i < NT; ++i) {
    const uvec4 v = imageLoad(wtex, min(t0 + int(i), last));
    [[unroll]] for (uint k = 0; k < 4; ++k) r[4 * i + k] = v[k];
  }
  [[unroll]] for (uint i = 4 * NT; i < 4 * NT + 4; ++i) r[i] = 0u;
  const uint k = (at >> 2) & 3u;
  const bool mid = (at & 2u) != 0;
  [[unroll]] for (uint i = 0; i < UNIT_WORDS; ++i) {
    const uint a = k == 0u ? r[i] : k == 1u ? r[i + 1] : k == 2u ? r[i + 2] : r[i + 3];
    const uint b = k == 0u ? r[i + 1] : k == 1u ? r[i + 2] : k == 2u ? r[i + 3] : r[i + 4];
    wd[i] = mid ? (a >> 16) | (b << 16) : a;
  }
#endif
}

// The unit in wd times this lane's x slice u of every column: part[c] for column c. Each weight is
// decoded once and multiplied into all columns while it is in a register (the column loop is the
// innermost), so COLS columns cost one decode and COLS multiply-adds per weight; each column's sums
// run in the same order whatever COLS is.
// MAC(s, w, e): s[c] += w · x[e] for every column c; MAC4 the same for a vec4 w of elements e … e+3.
#define MAC(s, w, e) [[unroll]] for (uint c = 0; c < COLS; ++c) s[c] += (w) * xs[c][u][e]
#define MAC4(s, w, e) [[unroll]] for (uint c = 0; c < COLS; ++c) s[c] += (w) * x4_at(c, u, e)
#define ZERO(s) [[unroll]] for (uint c = 0; c < COLS; ++c) s[c] = 0.0
#define ZERO4(s) [[unroll]] for (uint c = 0; c < COLS; ++c) s[c] = vec4(0.0)
void dot_unit(uint u, out float part[COLS]) {
  ZERO(part);
#if defined(WTYPE_Q4_0)
#if defined(X64_QUADS)
  // The unit as 64-bit words: a nibble is then two operations on the same 64-bit lanes as its product.
  uint64_t w64[(UNIT_WORDS + 1) / 2];
  [[unroll]] for (uint k = 0; k < (UNIT_WORDS + 1) / 2; ++k) w64[k] = packUint2x32(uvec2(wd[2 * k], wd[2 * k + 1]));
#endif
  [[unroll]] for (uint b = 0; b < 8; ++b) {
    // Byte j of the block holds element j (low nibble lo) and 16 + j (high nibble hi); with the whole
    // byte q = lo + 16·hi, lo·x[j] + hi·x[16 + j] = q·x[j] + hi·(x[16 + j] − 16·x[j]), which xq
    // holds for the upper elements: a byte, its high nibble (q >> 4) and two multiply-adds, one
    // mask fewer than each nibble on its own. Bytes 0–7 and 8–15 go into two sums (half_s[0], half_s[1]) of
    // 16 products each, which end within their 16-bit fields: the nibbles unsigned, their −8
    // through the half's packed sum of x9 (exact modulo 2^32 or 2^64). Each field starts biased by
    // 2^15 (FIELD_BIAS), so that it ends in [0, 2^16): the fields then come apart by masks with no
    // borrow between them.
    xint half_s[2][PACKS];
    [[unroll]] for (uint h = 0; h < 2; ++h)
      [[unroll]] for (uint i = 0; i < PACKS; ++i) half_s[h][i] = FIELD_BIAS - 8 * xqh[i][u][2 * b + h];
    [[unroll]] for (uint j = 0; j < 16; ++j) {
      const uint at = 18 * b + 2 + j;
#if defined(X64_QUADS)
      const xint q = int64_t((w64[at >> 3] >> (8 * (at & 7u))) & 0xFFul);
#else
      const xint q = int((wd[at >> 2] >> (8 * (at & 3u))) & 0xFFu);
#endif
      const xint hi = q >> 4;
      [[unroll]] for (uint i = 0; i < PACKS; ++i) {
        half_s[j / 8][i] += q * xq[i][u][32 * b + j] + hi * xq[i][u][32 * b + 16 + j];
      }
    }
    const float d = uh(18 * b);
    [[unroll]] for (uint i = 0; i < PACKS; ++i) {
      // The even fields and the odd ones, each moved into a 32-bit slot, where the two halves' sums
      // add without overflow: column FIELDS·i + f's slot then holds s0 + s1 + 2^16.
      const xint ev = (half_s[0][i] & FIELD_MASK) + (half_s[1][i] & FIELD_MASK);
      const xint od = ((half_s[0][i] >> 16) & FIELD_MASK) + ((half_s[1][i] >> 16) & FIELD_MASK);
      [[unroll]] for (uint f = 0; f < FIELDS; ++f) {
        const uint c = FIELDS * i + f;
        if (c < COLS) {
#if defined(X64_QUADS)
          const int v = int(f == 0 ? ev : f == 1 ? od : f == 2 ? ev >> 32 : od >> 32) - 0x10000;
#else
          const int v = (f == 0 ? ev : od) - 0x10000;
#endif
          part[c] += d * XD(c, u, b) * float(v);
        }
      }
    }
  }
#elif defined(WTYPE_F32) || defined(WTYPE_F16) || defined(WTYPE_BF16)
  vec4 s[COLS];
  ZERO4(s);
  [[unroll]] for (uint k = 0; k < 64; ++k) {
#if defined(WTYPE_F32)
    const vec4 w = uintBitsToFloat(uvec4(wd[4 * k], wd[4 * k + 1], wd[4 * k + 2], wd[4 * k + 3]));
#elif defined(WTYPE_F16)
    const vec4 w = vec4(unpackHalf2x16(wd[2 * k]), unpackHalf2x16(wd[2 * k + 1]));
#else
    const uint a = wd[2 * k], b = wd[2 * k + 1];
    const vec4 w = uintBitsToFloat(uvec4(a << 16, a & 0xFFFF0000u, b << 16, b & 0xFFFF0000u));
#endif
    MAC4(s, w, 4 * k);
  }
  [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] = s[c].x + s[c].y + s[c].z + s[c].w;
#elif defined(WTYPE_Q4_1)
  // (q·d + m): d·Σ q x + m·Σ x per block; nibbles masked in place (xs pre-scaled).
  [[unroll]] for (uint b = 0; b < 8; ++b) {
    float s[COLS];
    ZERO(s);
    [[unroll]] for (uint j = 0; j < 16; ++j) {
      const uint at = 20 * b + 4 + j, q = wd[at >> 2], sh = 8 * (at & 3u);
      const float lo = nib_at(q, sh), hi = nib_at(q, sh + 4);
      [[unroll]] for (uint c = 0; c < COLS; ++c) s[c] += lo * xs[c][u][32 * b + j] + hi * xs[c][u][32 * b + 16 + j];
    }
    const float d = uh(20 * b), m = uh(20 * b + 2);
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += d * s[c] + m * xsum[c][u][b];
  }
#elif defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
  // q = nibble | (bit j of qh) << 4; Q5_0: (q − 16)·d, Q5_1: q·d + m.
#if defined(WTYPE_Q5_0)
  const uint bb = 22, qh_at = 2;
#else
  const uint bb = 24, qh_at = 4;
#endif
  [[unroll]] for (uint b = 0; b < 8; ++b) {
    const uint qh = uw(bb * b + qh_at);
    float s[COLS];
    ZERO(s);
    [[unroll]] for (uint j = 0; j < 16; ++j) {
      const uint at = bb * b + qh_at + 4 + j, q = wd[at >> 2], sh = 8 * (at & 3u);
      const float lo = float(int((q >> sh) & 0xFu) | int(((qh >> j) & 1u) << 4));
      const float hi = float(int((q >> (sh + 4)) & 0xFu) | int(((qh >> (j + 16)) & 1u) << 4));
      [[unroll]] for (uint c = 0; c < COLS; ++c) s[c] += lo * xs[c][u][32 * b + j] + hi * xs[c][u][32 * b + 16 + j];
    }
    const float d = uh(bb * b);
#if defined(WTYPE_Q5_0)
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += d * (s[c] - 16.0 * xsum[c][u][b]);
#else
    const float m = uh(bb * b + 2);
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += d * s[c] + m * xsum[c][u][b];
#endif
  }
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
  // Sub-block j: 6-bit scale and min (scales at bytes 4…15); nibbles (low for even j, high for odd)
  // of qs[32 (j/2) …]; Q5_K adds a 5th bit from qh[l] (byte 16 + l) at bit j.
  const float d = uh(0), dmin = uh(2);
  [[unroll]] for (uint j = 0; j < 8; ++j) {
    float sc, mn;
    if (j < 4) {
      sc = float(int(ub(4 + j) & 63u));
      mn = float(int(ub(8 + j) & 63u));
    } else {
      sc = float(int((ub(8 + j) & 0xFu) | ((ub(j) >> 6) << 4)));
      mn = float(int((ub(8 + j) >> 4) | ((ub(4 + j) >> 6) << 4)));
    }
    float s[COLS];
    ZERO(s);
    [[unroll]] for (uint r = 0; r < 32; ++r) {
#if defined(WTYPE_Q4_K)
      const uint at = 16 + 32 * (j / 2) + r;
      MAC(s, nib_at(wd[at >> 2], 8 * (at & 3u) + 4 * (j & 1u)), 32 * j + r);
#else
      const uint at = 48 + 32 * (j / 2) + r, q = wd[at >> 2], sh = 8 * (at & 3u) + 4 * (j & 1u);
      const uint h = (ub(16 + r) >> j) & 1u;
      MAC(s, float(int(((q >> sh) & 0xFu) | (h << 4))), 32 * j + r);
#endif
    }
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += d * sc * s[c] - dmin * mn * xsum[c][u][j];
  }
#elif defined(WTYPE_Q2_K)
  // Element e: n = e/128, j = e%128/32, l = e%32: 2 bits at shift 2j of qs[32n + l] (byte 16 + …);
  // group g = e/16 has scale byte g: d·(lo nibble), min dmin·(hi nibble).
  const float d = uh(80), dmin = uh(82);
  [[unroll]] for (uint g = 0; g < 16; ++g) {
    const uint n = g / 8, j = (g % 8) / 2, l0 = (g % 2) * 16;
    float s[COLS];
    ZERO(s);
    [[unroll]] for (uint i = 0; i < 16; ++i) MAC(s, float(int((ub(16 + 32 * n + l0 + i) >> (2 * j)) & 3u)), 16 * g + i);
    const uint sc = ub(g);
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += d * float(int(sc & 0xFu)) * s[c] - dmin * float(int(sc >> 4)) * xsum[c][u][g];
  }
#elif defined(WTYPE_Q3_K)
  // Like Q2_K, plus a high bit from hmask[l] bit (4n + j) that, when clear, subtracts 4; 6-bit
  // scales (low 4 bits from byte is or the high nibble of byte is − 8, top 2 bits from byte
  // 8 + is%4 at shift 2·(is/4)), value − 32; d at byte 108.
  const float d = uh(108);
  [[unroll]] for (uint g = 0; g < 16; ++g) {
    const uint n = g / 8, j = (g % 8) / 2, l0 = (g % 2) * 16;
    float s[COLS];
    ZERO(s);
    [[unroll]] for (uint i = 0; i < 16; ++i) {
      const uint l = l0 + i;
      const int q = int((ub(32 + 32 * n + l) >> (2 * j)) & 3u) - (((ub(l) >> (4 * n + j)) & 1u) != 0 ? 0 : 4);
      MAC(s, float(q), 16 * g + i);
    }
    const uint lo = g < 8 ? (ub(96 + g) & 0xFu) : (ub(96 + g - 8) >> 4);
    const uint hi = (ub(104 + g % 4) >> (2 * (g / 4))) & 3u;
    const float scale = d * (float(int(lo | (hi << 4))) - 32.0);
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += scale * s[c];
  }
#elif defined(WTYPE_Q8_0)
  [[unroll]] for (uint b = 0; b < 8; ++b) {
    const uint o = 34 * b;
    vec4 s[COLS];
    ZERO4(s);
    [[unroll]] for (uint k = 0; k < 8; ++k) MAC4(s, i8x4(uw(o + 2 + 4 * k)), 32 * b + 4 * k);
    const float d = uh(o);
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += d * (s[c].x + s[c].y + s[c].z + s[c].w);
  }
#elif defined(WTYPE_IQ4_NL)
  [[unroll]] for (uint b = 0; b < 8; ++b) {
    float s[COLS];
    ZERO(s);
    [[unroll]] for (uint j = 0; j < 16; ++j) {
      const uint at = 18 * b + 2 + j, q = wd[at >> 2] >> (8 * (at & 3u));
      const float lo = iq4_value(q & 0xFu), hi = iq4_value((q >> 4) & 0xFu);
      [[unroll]] for (uint c = 0; c < COLS; ++c) s[c] += lo * xs[c][u][32 * b + j] + hi * xs[c][u][32 * b + 16 + j];
    }
    const float d = uh(18 * b);
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += d * s[c];
  }
#elif defined(WTYPE_IQ4_XS)
  // Sub-block ib of 32: 6-bit scale (low 4 bits from scales_l, high 2 from scales_h) − 32; its
  // 16 bytes of qs at 8 + 16 ib hold elements j (low nibble) and 16 + j (high).
  const float d = uh(0);
  const uint scales_h = ub(2) | (ub(3) << 8);
  [[unroll]] for (uint ib = 0; ib < 8; ++ib) {
    const uint ls = ((ub(4 + ib / 2) >> (4 * (ib % 2))) & 0xFu) | (((scales_h >> (2 * ib)) & 3u) << 4);
    float s[COLS];
    ZERO(s);
    [[unroll]] for (uint j = 0; j < 16; ++j) {
      const uint at = 8 + 16 * ib + j, q = wd[at >> 2] >> (8 * (at & 3u));
      const float lo = iq4_value(q & 0xFu), hi = iq4_value((q >> 4) & 0xFu);
      [[unroll]] for (uint c = 0; c < COLS; ++c) s[c] += lo * xs[c][u][32 * ib + j] + hi * xs[c][u][32 * ib + 16 + j];
    }
    const float scale = d * float(int(ls) - 32);
    [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += scale * s[c];
  }
#elif defined(WTYPE_Q6_K)
  // Element e: half n = e/128, quarter j = e%128/32, l = e%32. Low 4 bits: ql[64n + 32(j%2) + l],
  // low nibble for j < 2, high for j ≥ 2; high 2 bits: qh[32n + l] at shift 2j; scale
  // scales[8n + 2j + l/16]; value (q − 32)·d·scale.
  const float d = uh(208);
  [[unroll]] for (uint n = 0; n < 2; ++n) {
    [[unroll]] for (uint j = 0; j < 4; ++j) {
      [[unroll]] for (uint h = 0; h < 2; ++h) {  // l in [16h, 16h + 16)
        vec4 s[COLS];
        ZERO4(s);
        [[unroll]] for (uint k = 0; k < 4; ++k) {
          const uint l = 16 * h + 4 * k;
          const uint ql = wd[(64 * n + 32 * (j & 1u) + l) >> 2];
          const uint qh = wd[(128 + 32 * n + l) >> 2];
          const vec4 lo = vec4(ivec4((uvec4(ql) >> (uvec4(0, 8, 16, 24) + 4u * (j >> 1))) & 0xFu));
          const vec4 hi = vec4(ivec4((uvec4(qh) >> (uvec4(0, 8, 16, 24) + 2u * j)) & 3u));
          MAC4(s, lo + 16.0 * hi, 128 * n + 32 * j + 16 * h + 4 * k);
        }
        const uint is = 8 * n + 2 * j + h;
        const float scale = d * float(int(ub(192 + is) << 24) >> 24);
        [[unroll]] for (uint c = 0; c < COLS; ++c) part[c] += scale * (s[c].x + s[c].y + s[c].z + s[c].w - 32.0 * xsum[c][u][is]);
      }
    }
  }
#endif
}

#if INT_X
// A 32-element block of x quantized to ±255 (X_LEVELS, rounded to even) into q; returns its scale. A
// NaN or an infinity in the block makes the scale NaN and the values 0 (never garbage in another
// column's field): the column's results are NaN, as they are with float activations.
float quantize_x9(vec4 v[8], out int q[32]) {
  float amax = 0.0;
  bool finite = true;
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    const vec4 m = abs(v[i]);
    amax = max(amax, max(max(m.x, m.y), max(m.z, m.w)));
    finite = finite && !any(isnan(v[i])) && !any(isinf(v[i]));
  }
  const float id = finite && amax != 0.0 ? X_LEVELS / amax : 0.0;
  [[unroll]] for (uint i = 0; i < 8; ++i)
    [[unroll]] for (uint k = 0; k < 4; ++k) q[4 * i + k] = finite ? int(roundEven(v[i][k] * id)) : 0;
  return finite ? amax / X_LEVELS : uintBitsToFloat(0x7FC00000u);
}
#endif

void main() {
  const uint lane = gl_SubgroupInvocationID, S = gl_SubgroupSize;
  const uint n_units = p.cols / UNIT;
#if defined(X64_QUADS)
  // This lane's x slices, quantized, once for every row (columns past n_tokens are 0): the columns
  // in a loop that is not unrolled, each adding its x9 into its 16-bit field of xq[0] (PACKS is 1),
  // so that only one column's texel loads are inlined (all four's, unrolled, took lavapipe's LLVM
  // 8× as long to compile; docs/performance.md, "x before the row loop").
  [[unroll]] for (uint u = 0; u < UPL; ++u)
    [[unroll]] for (uint e = 0; e < UNIT; ++e) xq[0][u][e] = xint(0);
  [[dont_unroll]] for (uint c = 0; c < COLS; ++c) {
    const bool col = c < p.n_tokens;
    const uint col_at = p.x_base + (col ? c * (p.x_stride / 4) : 0);
    [[unroll]] for (uint u = 0; u < UPL; ++u) {
      const uint unit = u * S + lane;
      const uint at = col_at + min(unit, n_units - 1) * XV;
      [[unroll]] for (uint b = 0; b < SUBS; ++b) {
        vec4 v[8];
        [[unroll]] for (uint i = 0; i < 8; ++i)
          v[i] = col && unit < n_units ? uintBitsToFloat(imageLoad(x_tex, int(at + 8 * b + i))) : vec4(0.0);
        int q[32];
        const float dx = quantize_x9(v, q);
        [[unroll]] for (uint e = 0; e < 32; ++e) xq[0][u][32 * b + e] += xint(q[e]) << (16 * c);
        XD(c, u, b) = dx;
      }
    }
  }
#else
  // This lane's x slices and their block sums, once for every row (columns past n_tokens are 0).
  [[unroll]] for (uint c = 0; c < COLS; ++c) {
    const bool col = c < p.n_tokens;
    const uint col_at = col ? c * (p.x_stride / 4) : 0;
    [[unroll]] for (uint u = 0; u < UPL; ++u) {
      const uint unit = u * S + lane;
      const uint at = col_at + min(unit, n_units - 1) * XV;
      [[unroll]] for (uint b = 0; b < SUBS; ++b) {
#if INT_X
        vec4 v[8];
        [[unroll]] for (uint i = 0; i < 8; ++i) v[i] = col && unit < n_units ? x4[at + 8 * b + i] : vec4(0.0);
        int q[32];
        const float dx = quantize_x9(v, q);
        [[unroll]] for (uint e = 0; e < 32; ++e) {
          if (c % FIELDS == 0) xq[c / FIELDS][u][32 * b + e] = xint(q[e]);
          else xq[c / FIELDS][u][32 * b + e] += xint(q[e]) << (16 * (c % FIELDS));
        }
        XD(c, u, b) = dx;
#else
        vec4 t = vec4(0.0);
        [[unroll]] for (uint i = 0; i < XV / SUBS; ++i) {
          const uint e = (b * (XV / SUBS) + i) * 4;
          const vec4 v = col && unit < n_units ? x4[at + e / 4] : vec4(0.0);
          t += v;
          [[unroll]] for (uint k = 0; k < 4; ++k) xs[c][u][e + k] = v[k] * xs_scale(e + k);
        }
        xsum[c][u][b] = t.x + t.y + t.z + t.w;
#endif
      }
    }
  }
#endif
#if INT_X
  // Each half block's packed sum of x9 (for the −8 of every nibble): half 2b is bytes 0–7 of block b,
  // elements 32b + j and 32b + 16 + j for j < 8; half 2b + 1 bytes 8–15. Then the upper elements
  // become x[16 + j] − 16·x[j] (each field within ±4,335; packed, exact modulo 2^32 or 2^64).
  [[unroll]] for (uint i = 0; i < PACKS; ++i)
    [[unroll]] for (uint u = 0; u < UPL; ++u)
      [[unroll]] for (uint h = 0; h < 16; ++h) {
        xint s = xint(0);
        [[unroll]] for (uint j = 0; j < 8; ++j) s += xq[i][u][32 * (h / 2) + 8 * (h % 2) + j] + xq[i][u][32 * (h / 2) + 16 + 8 * (h % 2) + j];
        xqh[i][u][h] = s;
      }
  [[unroll]] for (uint i = 0; i < PACKS; ++i)
    [[unroll]] for (uint u = 0; u < UPL; ++u)
      [[unroll]] for (uint b = 0; b < 8; ++b)
        [[unroll]] for (uint j = 0; j < 16; ++j) xq[i][u][32 * b + 16 + j] -= 16 * xq[i][u][32 * b + j];
#endif
  const uint first = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * p.rows_per_group;
  const uint last = min(first + p.rows_per_group, p.rows);
  // With glu each output row takes two weight rows, gate then up, through the same loop body.
  const uint per_row = p.glu != 0u ? 2 : 1;
  // The rows go in groups of W (the subgroup size): row j of a group is kept by lane j, and the group
  // is stored at once after its loop, every lane storing its row. lavapipe runs the body of a branch
  // for every lane whether taken or not, so a store per row behind `lane == 0` cost the destination
  // arithmetic (an integer division per lane), the gated activation and the y accesses for all W
  // lanes on every row: for 4 columns as much as the dot products. Now once per W rows.
  const uint W = gl_WorkGroupSize.x, n_out = last - first;
  for (uint g = 0; g < n_out; g += W) {
    const uint n_here = min(W, n_out - g);
    float kept[COLS], kept_gate[COLS];
    [[unroll]] for (uint c = 0; c < COLS; ++c) kept[c] = kept_gate[c] = 0.0;
    for (uint k = 0; k < n_here * per_row; ++k) {
      const uint j = k / per_row, row = first + g + j + (k % per_row) * p.rows;
      // Each unit's bytes are loaded once and multiplied into every column; a column's sum runs in
      // the same order whatever COLS is, so its result does not depend on the batch.
      float acc[COLS];
      [[unroll]] for (uint c = 0; c < COLS; ++c) acc[c] = 0.0;
      [[unroll]] for (uint u = 0; u < UPL; ++u) {
        const uint unit = u * S + lane;
        if (unit < n_units) {
          load_unit(row * p.row_bytes + unit * UNIT_BYTES);
          float part[COLS];
          dot_unit(u, part);
          [[unroll]] for (uint c = 0; c < COLS; ++c) acc[c] += part[c];
        }
      }
      const bool gate_row = per_row == 2 && k % 2 == 0;
      // The columns' sums four at a time. lavapipe reduces each component of the vec4 in a loop of
      // its own over the lanes (four loops in its JIT code), each in the same order as a lone
      // float's, so a column's total is the same in any COLS. (A lone column keeps its float: summed
      // through a loop whose start was not a constant, its reduction left lavapipe two more loops per
      // row and the kernel ≈ 20% slower.)
      float total[COLS];
      if (COLS % 4 == 0) {
        [[unroll]] for (uint c = 0; c < COLS; c += 4) {
          const vec4 t = subgroupAdd(vec4(acc[c], acc[c + 1], acc[c + 2], acc[c + 3]));
          [[unroll]] for (uint i = 0; i < 4; ++i) total[c + i] = t[i];
        }
      } else {
        [[unroll]] for (uint c = 0; c < COLS; ++c) total[c] = subgroupAdd(acc[c]);
      }
      [[unroll]] for (uint c = 0; c < COLS; ++c) {
        if (gate_row) kept_gate[c] = lane == j ? total[c] : kept_gate[c];
        else kept[c] = lane == j ? total[c] : kept[c];
      }
    }
    [[unroll]] for (uint c = 0; c < COLS; ++c) {
      if (lane < n_here && c < p.n_tokens) {
        const uint at = matmul_dest(first + g + lane, c);
        y[at] = matmul_store_value(per_row == 2 ? glu_apply(kept_gate[c], kept[c]) : kept[c], y[at]);
      }
    }
  }
}
