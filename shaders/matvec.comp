// matvec: y[dest(r, t)] (+)= W[r] · x[t] for activation vectors t = COLS·z … COLS·z + COLS - 1 of
// the workgroup's layer z (decode on GPUs: one; the server's step of several sequences and short
// prompt chunks on GPUs: COLS at a time, each piece of the weights loaded once for all of them, and
// each column computed exactly as it would be alone in the same specialization). A workgroup
// handles ROWS consecutive rows in row groups of SPLIT subgroups; each group takes RPS rows at a
// time, its invocations stride over the rows' pieces (IN_FLIGHT in flight per invocation), each
// piece's x loaded once for the RPS rows, one subgroupAdd per row, column and subgroup, and with
// SPLIT > 1 the group's sums added in shared memory. Correct for any actual subgroup count (row
// groups are strided by the groups the workgroup holds). The host's MatvecTuning
// (core/kernels/ops.h) picks the constants: on GPUs the best of an H200 sweep (docs/performance.md),
// on CPU drivers one row per subgroup, one piece in flight and one column.
//
// A piece is 8 elements of the row: neighbouring invocations take neighbouring pieces, so a
// subgroup's loads of x (vec4 where the host says x is 16-byte aligned: X_VEC4) and of the weights
// cover one stretch of memory each instead of one stretch per invocation (each invocation a whole
// block read x from 128-byte-apart addresses: a 32-way uncoalesced load on a GPU, measured
// 26% of the read ceiling for Q4_0 on an H200). Each weight byte is read once:
//   - the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): piece i of a block is its
//     quantized word i (elements 4i … 4i+3 and 16+4i … 16+4i+3 of the 4-bit types, 8i … 8i+7 of
//     Q8_0), times the block's scale (offsets and mins through the piece's sum of x);
//   - Q4_K, Q5_K: piece i of a 64-element chunk is its word i (4 elements of each of the chunk's
//     two sub-blocks, which share their nibble bytes; Q5_K's fifth bits from qh's word i), the
//     scales and mins decoded from the three words that hold all of them;
//   - Q6_K, Q2_K, Q3_K: a piece is 16 elements, word i of a 128-element half's low bits (ql, qs)
//     holding 4 elements of each of its 4 quarters (Q6_K: two words, low and high nibbles; the high
//     bits from qh's or hmask's word i), the 4 quarters' scales from two or three words;
//   - the other types (F32, F16, BF16, IQ4_XS): 8 consecutive elements through dequant.glsl's dq8.
// Where rows go, and the gated activation of a fused gate|up projection (each row then done for
// its gate row and its up row): common/matmul_out.glsl.
// Bindings: 0 W [rows][row_bytes] (weight type), 1 x [n_tokens][x_stride] f32, 2 y f32.
// Specialization: 0 workgroup size, 1 ROWS (rows per workgroup; the host uses size / subgroup
// size / SPLIT × RPS), 2 X_VEC4 (x's binding offset and x_stride allow vec4 loads), 3 IN_FLIGHT
// (pieces per invocation per loop step), 4 RPS (rows per row group at a time), 5 SPLIT (subgroups
// per row group), 6 COLS (columns per workgroup; MatmulParams' n_tokens counts those of the dispatch),
// 7 SG_MIN (sizes the shared sums of SPLIT > 1).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#define WEIGHT_BINDING 0
#include "dequant.glsl"
#include "params.h"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 8;
layout(constant_id = 2) const bool X_VEC4 = false;
layout(constant_id = 3) const uint IN_FLIGHT = 1;
layout(constant_id = 4) const uint RPS = 1;  // rows per subgroup at a time, sharing each piece's x
layout(constant_id = 5) const uint SPLIT = 1;  // subgroups per row group, splitting its rows' pieces
layout(constant_id = 6) const uint COLS = 1;  // columns per workgroup, each piece's weights read once for all
// The narrowest subgroup the device may run: a quarter of the size it reports (as rms_norm.comp
// assumes), so a workgroup holds at most WG_SIZE / SG_MIN subgroups.
layout(constant_id = 7) const uint SG_MIN = 1;
const uint WG_SIZE = gl_WorkGroupSize.x;
#if defined(X_Q8)
// x as quantize_x.comp writes it (8-bit blocks, then their scales), and the integer dot product of
// four signed bytes (SPIR-V OpSDot, VK_KHR_shader_integer_dot_product; glslang has no GLSL name for it).
#extension GL_EXT_spirv_intrinsics : require
layout(binding = 1) readonly buffer XQ { uint xw[]; };
layout(binding = 1) readonly buffer XQF { float xwf[]; };
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal int packed_format);
int sdot(uint a, uint b) { return sdot4(a, b, 0); }
#else
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer X4 { vec4 x4[]; };
#endif
layout(binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { MatmulParams p; };
#include "matmul_out.glsl"

#if defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1) || defined(WTYPE_Q8_0) || \
    defined(WTYPE_IQ4_NL)
#define UNIT 32
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
#define UNIT 64
#elif defined(WTYPE_Q6_K) || defined(WTYPE_Q2_K) || defined(WTYPE_Q3_K)
#define UNIT 128
#else
#define UNIT 8
#endif
// Elements per piece.
#if UNIT == 128
#define PIECE 16
#else
#define PIECE 8
#endif

#if !defined(X_Q8)
// x[at … at+3] (at a multiple of 4).
vec4 xv(uint at) { return X_VEC4 ? x4[at >> 2] : vec4(x[at], x[at + 1], x[at + 2], x[at + 3]); }
#endif
// The 4 bytes at byte o, o a multiple of 4, from one 32-bit load (dequant.glsl's word_at takes
// two 16-bit loads for an even o).
uint w1x32(uint o) { return floatBitsToUint(w32[o >> 2]); }
// The 4 bytes at byte o (o even) with one 32-bit load where o is a multiple of 4, else two 16-bit.
uint wany(uint o) { return (o & 3u) == 0 ? w1x32(o) : word_at(o); }
// Byte b (0…3) of word q as a signed byte (dequant.glsl's byte_of: unsigned).
int sbyte_of(uint q, uint b) { return int(q << (24u - 8u * b)) >> 24; }
// The four bytes (or nibbles at bit `sh`, masked to `mask`) of word q, as floats.
vec4 bytes_of(uint q, uint sh, uint mask) { return vec4((uvec4(q) >> (uvec4(0, 8, 16, 24) + sh)) & mask); }
vec4 i8_of(uint q) { return vec4((ivec4(q) << ivec4(24, 16, 8, 0)) >> 24); }
float sum4(vec4 v) { return (v.x + v.y) + (v.z + v.w); }
#if defined(WTYPE_IQ4_NL)
vec4 iq4_of(uint q, uint sh) {
  const uvec4 n = (uvec4(q) >> (uvec4(0, 8, 16, 24) + sh)) & 0xFu;
  return vec4(KVALUES_IQ4[n.x], KVALUES_IQ4[n.y], KVALUES_IQ4[n.z], KVALUES_IQ4[n.w]);
}
#endif

#if UNIT == 64
// Q4_K, Q5_K: the scales and mins of chunk c's two sub-blocks (2c, 2c + 1) of the super-block at
// byte `base`, from the three words that hold all twelve scale bytes (each one load, the same
// address for a block's invocations).
void chunk_scales(uint base, uint c, out float sc0, out float mn0, out float sc1, out float mn1) {
  const uint s0 = w1x32(base + 4), s1 = w1x32(base + 8), s2 = w1x32(base + 12);
  scale_min_words(s0, s1, s2, 2 * c, sc0, mn0);
  scale_min_words(s0, s1, s2, 2 * c + 1, sc1, mn1);
}
#endif
#if defined(WTYPE_Q6_K)
// Q6_K: the words of half n's piece i (see piece_dot): ql's words i and 8 + i (low nibbles of
// quarters 0, 1; high ones of quarters 2, 3), qh's word i, and the half's 8 signed scale bytes.
struct Q6Words {
  uint ql0, ql1, qh, sa, sb;
};
Q6Words q6_words(uint base, uint n, uint i) {
  return Q6Words(wany(base + 64 * n + 4 * i), wany(base + 64 * n + 32 + 4 * i), wany(base + 128 + 32 * n + 4 * i),
                 wany(base + 192 + 8 * n), wany(base + 196 + 8 * n));
}
#endif

// x for one piece: the vec4s its elements meet (see load_x). Loaded once per piece and used for
// every row of the subgroup's group.
#if PIECE == 16
#define XN 4
#else
#define XN 2
#endif
#if defined(X_Q8)
struct PieceX {
  uint w[XN];   // the piece's elements as signed bytes, 4 to a word, in piece_dot's order
  float d[XN];  // each word's block scale
};
#else
struct PieceX {
  vec4 v[XN];
};
#endif

#if UNIT >= 32
// The first elements of the runs of 4 that piece s multiplies, in piece_dot's order (one run per x
// word of X_Q8, per vec4 of the f32 path).
void piece_elements(uint s, out uint e[XN]) {
#if UNIT == 32 && defined(WTYPE_Q8_0)
  e[0] = (s / 4) * 32 + 8 * (s % 4);
  e[1] = e[0] + 4;
#elif UNIT == 32
  // elements 4i … 4i+3 and 16+4i … 16+4i+3 of the block (low and high nibbles of word i)
  e[0] = (s / 4) * 32 + 4 * (s % 4);
  e[1] = e[0] + 16;
#elif UNIT == 64
  // word i of a 64-element chunk: 4 elements of each of its two sub-blocks
  e[0] = (s / 8) * 64 + 4 * (s % 8);
  e[1] = e[0] + 32;
#else
  // word i of a 128-element half: 4 elements of each of its four quarters
  const uint p16 = s % 16;
  e[0] = (s / 16) * 256 + 128 * (p16 / 8) + 4 * (p16 % 8);
  [[unroll]] for (uint j = 1; j < XN; ++j) e[j] = e[0] + 32 * j;
#endif
}
#endif

// x for piece s (x_at: the column's first element, or with X_Q8 its first word): the elements
// piece_dot multiplies, in its order.
PieceX load_x(uint s, uint x_at) {
  PieceX X;
#if UNIT >= 32
  uint e[XN];
  piece_elements(s, e);
  [[unroll]] for (uint j = 0; j < XN; ++j) {
#if defined(X_Q8)
    // element e is byte e % 4 of word e / 4; its block's scale the (e / 32)-th after the bytes
    X.w[j] = xw[x_at + e[j] / 4];
    X.d[j] = xwf[x_at + p.cols / 4 + e[j] / 32];
#else
    X.v[j] = xv(x_at + e[j]);
#endif
  }
#else
  // 8 consecutive elements, 0 past the row's end (rows of the plain types need not be a multiple of 8).
  const uint k = 8 * s;
  [[unroll]] for (uint i = 0; i < 8; ++i) X.v[i / 4][i % 4] = k + i < p.cols ? x[x_at + k + i] : 0.0;
#endif
  return X;
}

// Piece s (PIECE elements of the row, in the order above) of the row at byte row_base, times its
// x (load_x).
float piece_dot(uint row_base, uint s, PieceX X) {
  // (With X_Q8: integer dot products of the piece's weights, as bytes, with x's bytes, times the
  // scales; a weight's offset or min through the sum of x's bytes, a dot product with 0x01010101.)
#if UNIT == 32
  const uint i = s % 4, base = row_base + (s / 4) * BLOCK_BYTES;
  const float d = wf16(base);
#if defined(WTYPE_Q8_0)
  const uint qs = base + 2 + 8 * i;
#if defined(X_Q8)
  // (Both words of a piece lie in one x block: X.d[0] == X.d[1].)
  return d * X.d[0] * float(sdot(wany(qs), X.w[0]) + sdot(wany(qs + 4), X.w[1]));
#else
  return d * sum4(i8_of(wany(qs)) * X.v[0] + i8_of(wany(qs + 4)) * X.v[1]);
#endif
#else
  // Elements 4i … 4i+3 are the low nibbles of qs bytes 4i … 4i+3, elements 16+4i … the high ones.
#if defined(WTYPE_Q4_0) || defined(WTYPE_IQ4_NL)
  const uint qs = base + 2;
#elif defined(WTYPE_Q4_1)
  const uint qs = base + 4;
#elif defined(WTYPE_Q5_0)
  const uint qh = word_at(base + 2), qs = base + 6;
#else  // Q5_1
  const uint qh = w1x32(base + 4), qs = base + 8;
#endif
  const uint q = wany(qs + 4 * i);
#if defined(X_Q8) && defined(WTYPE_Q4_0)
  // Each nibble minus 8 as a signed byte: (n + 120) ^ 128 is n − 8 modulo 256, no carry between bytes.
  const uint lo = ((q & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u, hi = (((q >> 4) & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u;
  return d * X.d[0] * float(sdot(lo, X.w[0]) + sdot(hi, X.w[1]));
#elif defined(X_Q8)  // Q4_1: d·q + m
  const int dot_q = sdot(q & 0x0F0F0F0Fu, X.w[0]) + sdot((q >> 4) & 0x0F0F0F0Fu, X.w[1]);
  const int sum_x = sdot(0x01010101u, X.w[0]) + sdot(0x01010101u, X.w[1]);
  return X.d[0] * (d * float(dot_q) + wf16(base + 2) * float(sum_x));
#else
  const vec4 xl = X.v[0], xh = X.v[1];
#if defined(WTYPE_IQ4_NL)
  return d * sum4(iq4_of(q, 0) * xl + iq4_of(q, 4) * xh);
#else
  vec4 lo = bytes_of(q, 0, 0xFu), hi = bytes_of(q, 4, 0xFu);
#if defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
  lo += 16.0 * vec4((uvec4(qh) >> (uvec4(0, 1, 2, 3) + 4 * i)) & 1u);
  hi += 16.0 * vec4((uvec4(qh) >> (uvec4(16, 17, 18, 19) + 4 * i)) & 1u);
#endif
  const float dot_q = sum4(lo * xl + hi * xh), sum_x = sum4(xl + xh);
#if defined(WTYPE_Q4_0)
  return d * (dot_q - 8.0 * sum_x);
#elif defined(WTYPE_Q5_0)
  return d * (dot_q - 16.0 * sum_x);
#else  // Q4_1, Q5_1: q·d + m
  return d * dot_q + wf16(base + 2) * sum_x;
#endif
#endif
#endif
#endif
#elif UNIT == 64
  // Q4_K, Q5_K: word i of chunk c of the super-block, sub-blocks 2c (low nibbles) and 2c+1 (high),
  // each d·scale·q − dmin·min.
  const uint i = s % 8, k = (s / 8) * 64, base = row_base + (k / 256) * BLOCK_BYTES, c = (k % 256) / 64;
  float sc0, mn0, sc1, mn1;
  chunk_scales(base, c, sc0, mn0, sc1, mn1);
  const float d = wf16(base), dmin = wf16(base + 2);
#if defined(WTYPE_Q4_K)
  const uint q = w1x32(base + 16 + 32 * c + 4 * i);
#else
  // The fifth bit of element 4i + m of either sub-block: bit 2c (or 2c + 1) of qh byte 4i + m.
  const uint q = w1x32(base + 48 + 32 * c + 4 * i), qh = w1x32(base + 16 + 4 * i);
#endif
#if defined(X_Q8)
  uint lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
#if defined(WTYPE_Q5_K)
  lo |= ((qh >> (2 * c)) & 0x01010101u) << 4;  // (the fifth bit moved to bit 4 of each byte)
  hi |= ((qh >> (2 * c + 1)) & 0x01010101u) << 4;
#endif
  const float part0 = d * sc0 * float(sdot(lo, X.w[0])) - dmin * mn0 * float(sdot(0x01010101u, X.w[0]));
  const float part1 = d * sc1 * float(sdot(hi, X.w[1])) - dmin * mn1 * float(sdot(0x01010101u, X.w[1]));
  return X.d[0] * part0 + X.d[1] * part1;
#else
  vec4 lo = bytes_of(q, 0, 0xFu), hi = bytes_of(q, 4, 0xFu);
#if defined(WTYPE_Q5_K)
  lo += 16.0 * bytes_of(qh, 2 * c, 1u);
  hi += 16.0 * bytes_of(qh, 2 * c + 1, 1u);
#endif
  const vec4 xl = X.v[0], xh = X.v[1];
  return d * (sc0 * sum4(lo * xl) + sc1 * sum4(hi * xh)) - dmin * (mn0 * sum4(xl) + mn1 * sum4(xh));
#endif
#elif UNIT == 128
  // Piece i (0…7) of half n of a super-block: elements 128n + 32j + 4i + m of quarters j = 0…3,
  // m = 0…3, whose low bits are byte 4i + m of a word of the half (the quarter picks the shift or
  // nibble) and whose scale is sub-block 8n + 2j + i/4.
  const uint p16 = s % 16, n = p16 / 8, i = p16 % 8, base = row_base + (s / 16) * BLOCK_BYTES;
  float acc = 0.0;
#if defined(WTYPE_Q6_K)
  // Low 4 bits: ql word i of the half (quarters 0, 2: low and high nibbles) and word 8 + i
  // (quarters 1, 3); high 2 bits: qh word i at shift 2j; scales: the half's 8 signed bytes.
  const Q6Words q6 = q6_words(base, n, i);
  [[unroll]] for (uint j = 0; j < 4; ++j) {
    const float sc = float(sbyte_of(j < 2 ? q6.sa : q6.sb, i / 4 + 2 * (j & 1u)));
    const uint ql = (j & 1u) == 0 ? q6.ql0 : q6.ql1;
#if defined(X_Q8)
    // The 6-bit values minus 32 as signed bytes: (v + 96) ^ 128 is v − 32 modulo 256.
    const uint v = ((ql >> (4 * (j / 2))) & 0x0F0F0F0Fu) | (((q6.qh >> (2 * j)) & 0x03030303u) << 4);
    acc += sc * X.d[j] * float(sdot((v + 0x60606060u) ^ 0x80808080u, X.w[j]));
#else
    const vec4 q = bytes_of(ql, 4 * (j / 2), 0xFu) + 16.0 * bytes_of(q6.qh, 2 * j, 3u) - 32.0;
    acc += sc * sum4(q * X.v[j]);
#endif
  }
  return wf16(base + 208) * acc;
#elif defined(WTYPE_Q2_K)
  // 2 bits at shift 2j of qs word i of the half; scale byte 8n + 2j + i/4: d times its low nibble,
  // dmin times its high nibble the min.
  const uint q = w1x32(base + 16 + 32 * n + 4 * i);
  const uint sa = w1x32(base + 8 * n), sb = w1x32(base + 8 * n + 4);
  float mins = 0.0;
  [[unroll]] for (uint j = 0; j < 4; ++j) {
    const uint sc = byte_of(j < 2 ? sa : sb, i / 4 + 2 * (j & 1u));
    const vec4 x4j = X.v[j];
    acc += float(sc & 0xFu) * sum4(bytes_of(q, 2 * j, 3u) * x4j);
    mins += float(sc >> 4) * sum4(x4j);
  }
  return wf16(base + 80) * acc - wf16(base + 82) * mins;
#else  // Q3_K
  // 2 bits at shift 2j of qs word i of the half, minus 4 where bit 4n + j of the hmask byte is
  // clear (hmask word i); 6-bit scale of sub-block is = 8n + 2j + i/4: its low 4 bits the low (n = 0)
  // or high (n = 1) nibble of scale byte 2j + i/4, its top 2 bits from byte 8 + (2j + i/4) % 4 at
  // shift 2(2n + j/2); value − 32.
  const uint q = wany(base + 32 + 32 * n + 4 * i), hm = wany(base + 4 * i);
  const uint sa = wany(base + 96), sb = wany(base + 100), sh = wany(base + 104);
  [[unroll]] for (uint j = 0; j < 4; ++j) {
    const uint b = i / 4 + 2 * (j & 1u);
    const uint lo = (byte_of(j < 2 ? sa : sb, b) >> (4 * n)) & 0xFu;
    const uint hi = (byte_of(sh, (2 * j + i / 4) % 4) >> (2 * (2 * n + j / 2))) & 3u;
    const vec4 v = bytes_of(q, 2 * j, 3u) - 4.0 + 4.0 * bytes_of(hm, 4 * n + j, 1u);
    acc += float(int(lo | (hi << 4)) - 32) * sum4(v * X.v[j]);
  }
  return wf16(base + 108) * acc;
#endif
#else
  const uint k = 8 * s;
  uint base, j8;
  dq_offsets(row_base, k, base, j8);
  float v[8];
  dq8(base, j8, min(8u, p.cols - k), v);
  float acc = 0.0;
  for (uint i = 0; i < 8 && k + i < p.cols; ++i) acc += v[i] * X.v[i / 4][i % 4];
  return acc;
#endif
}

// Whether column slot c of a workgroup holds a column: slot 0 always does, so a one-column kernel
// tests nothing.
bool is_live(uint c, uint live) { return c == 0 || c < live; }

// RPS rows from row r0 (rows past `end` repeat the last one; their sums are not stored), half h
// of a gate|up pair, times the `live` columns of x from elements x_at[c], this invocation's share of
// each: pieces strided by the `parts` subgroups that split the rows (part `part` of them), IN_FLIGHT
// at a time (GPUs: their loads all issued before their arithmetic waits on any; on lavapipe an
// unrolled loop made the whole kernel 2.6× slower, so CPU drivers take one). Each piece's x is loaded
// once for the RPS rows, and each piece's weights once for the columns: column c's piece_dot reads
// the same words as column 0's, which always runs first (a compiler's common loads; the columns past
// `live` are skipped by a uniform branch). Each row's and column's sum runs in the same order
// whatever RPS, COLS and `live` are.
void rows_share(uint r0, uint h, uint end, uint x_at[COLS], uint live, uint part, uint parts, out float acc[RPS][COLS]) {
  uint base[RPS];
  [[unroll]] for (uint i = 0; i < RPS; ++i) {
    base[i] = (min(r0 + i, end - 1) + h * p.rows) * p.row_bytes;
    [[unroll]] for (uint c = 0; c < COLS; ++c) acc[i][c] = 0.0;
  }
  // (A workgroup smaller than a subgroup fills only WG_SIZE of its lanes.)
  const uint lanes = min(gl_SubgroupSize, WG_SIZE);
  const uint n = (p.cols + PIECE - 1) / PIECE, step = lanes * parts;
  uint s = part * lanes + gl_SubgroupInvocationID;
  if (IN_FLIGHT > 1)
    for (; s + (IN_FLIGHT - 1) * step < n; s += IN_FLIGHT * step) {
      [[unroll]] for (uint c = 0; c < COLS; ++c) {
        if (!is_live(c, live)) break;
        PieceX xs[IN_FLIGHT];
        [[unroll]] for (uint j = 0; j < IN_FLIGHT; ++j) xs[j] = load_x(s + j * step, x_at[c]);
        [[unroll]] for (uint i = 0; i < RPS; ++i) {
          float sum = piece_dot(base[i], s, xs[0]);
          [[unroll]] for (uint j = 1; j < IN_FLIGHT; ++j) sum += piece_dot(base[i], s + j * step, xs[j]);
          acc[i][c] += sum;
        }
      }
    }
  for (; s < n; s += step) {
    [[unroll]] for (uint c = 0; c < COLS; ++c) {
      if (!is_live(c, live)) break;
      const PieceX x0 = load_x(s, x_at[c]);
      [[unroll]] for (uint i = 0; i < RPS; ++i) acc[i][c] += piece_dot(base[i], s, x0);
    }
  }
}

// With SPLIT > 1, each row group's subgroups' sums (both halves of a gate|up pair) meet here: the
// sum of subgroup g, half h, row i, column c at red_at(g, h, i, c).
const uint RED = SPLIT > 1 ? 2 * RPS * COLS * (WG_SIZE / SG_MIN) : 1;
shared float red[RED];
uint red_at(uint g, uint h, uint i, uint c) { return ((2 * g + h) * RPS + i) * COLS + c; }

void main() {
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint first = wg * ROWS, end = min(first + ROWS, p.rows);
  // This workgroup's columns: t0 … t0 + live - 1 (at least one).
  const uint t0 = gl_WorkGroupID.z * COLS, live = min(COLS, p.n_tokens - t0);
  uint x_at[COLS];
  [[unroll]] for (uint c = 0; c < COLS; ++c) x_at[c] = (t0 + c) * p.x_stride;  // (read for live columns only)
  const uint halves = p.glu != 0u ? 2 : 1;
  // Row groups of `parts` subgroups each (as many as the subgroups the device actually made allow);
  // a subgroup past the last whole group only meets the barriers.
  const uint parts = min(SPLIT, gl_NumSubgroups), groups = gl_NumSubgroups / parts;
  const uint group = gl_SubgroupID / parts, part = gl_SubgroupID % parts;
  // The same number of passes in every subgroup (the barriers of SPLIT > 1 are met by all).
  for (uint pass = first; pass < end; pass += groups * RPS) {
    const uint r0 = pass + group * RPS;
    const bool mine = group < groups && r0 < end;
    float total[RPS][COLS], gate[RPS][COLS];
    if (mine) {
      for (uint h = 0; h < halves; ++h) {
        float acc[RPS][COLS];
        rows_share(r0, h, end, x_at, live, part, parts, acc);
        [[unroll]] for (uint i = 0; i < RPS; ++i)
          [[unroll]] for (uint c = 0; c < COLS; ++c) {
            if (!is_live(c, live)) break;
            total[i][c] = subgroupAdd(acc[i][c]);
            if (h == 0) gate[i][c] = total[i][c];
          }
      }
    }
    if (SPLIT > 1) {
      // Each subgroup's sums to shared memory, then the group's first subgroup adds them in part order.
      if (mine && subgroupElect()) {
        [[unroll]] for (uint i = 0; i < RPS; ++i)
          [[unroll]] for (uint c = 0; c < COLS; ++c) {
            if (!is_live(c, live)) break;
            red[red_at(gl_SubgroupID, 0, i, c)] = gate[i][c];
            red[red_at(gl_SubgroupID, 1, i, c)] = total[i][c];
          }
      }
      barrier();
      if (mine && part == 0) {
        [[unroll]] for (uint i = 0; i < RPS; ++i)
          [[unroll]] for (uint c = 0; c < COLS; ++c) {
            if (!is_live(c, live)) break;
            gate[i][c] = red[red_at(gl_SubgroupID, 0, i, c)];
            total[i][c] = red[red_at(gl_SubgroupID, 1, i, c)];
            for (uint q = 1; q < parts; ++q) {
              gate[i][c] += red[red_at(gl_SubgroupID + q, 0, i, c)];
              total[i][c] += red[red_at(gl_SubgroupID + q, 1, i, c)];
            }
          }
      }
      barrier();
    }
    if (mine && part == 0 && subgroupElect()) {
      [[unroll]] for (uint i = 0; i < RPS; ++i) {
        if (r0 + i >= end) break;
        [[unroll]] for (uint c = 0; c < COLS; ++c) {
          if (!is_live(c, live)) break;
          const uint at = matmul_dest(r0 + i, t0 + c);
          y[at] = matmul_store_value(halves == 2 ? glu_apply(gate[i][c], total[i][c]) : total[i][c], y[at]);
        }
      }
    }
  }
}
