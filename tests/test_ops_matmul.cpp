// get_rows, matvec and matmul shaders against the scalar references, for every weight type over
// shapes that are not multiples of the workgroup or tile sizes, and split across bindings.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <memory>
#include <random>

#include "op_test_util.h"
#include "kernels/ops.h"
#include "kernels/params.h"
#include "reference/ref_ops.h"
#include "kernels/tensor.h"

using namespace vkllm;
using gguf::TensorType;

namespace {

struct Shape {
  uint32_t rows, cols;
};

const TensorType k_types[] = {TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0, TensorType::Q4_1,
                              TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K,
                              TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::IQ4_NL, TensorType::IQ4_XS};

// Odd sizes for every kernel; rows of whole 256-element units (512, 2304) also take matvec_simd on
// CPU devices, 2304 with 9 units so that some lanes own two units and the others one.
std::vector<Shape> shapes_for(TensorType t) {
  const uint32_t qk = gguf::type_info(static_cast<uint32_t>(t))->block_size;
  if (qk == 1) return {{1, 8}, {37, 172}, {70, 13}, {129, 256}};
  if (qk == 32) return {{1, 32}, {37, 96}, {70, 320}, {129, 64}, {37, 512}, {9, 2304}};
  return {{1, 256}, {37, 512}, {70, 256}, {9, 2304}};
}

std::vector<uint8_t> quantized(TensorType t, const std::vector<float>& src, uint32_t rows, uint32_t cols) {
  const uint64_t row_bytes = gguf::type_bytes(t, cols);
  std::vector<uint8_t> out(row_bytes * rows);
  for (uint32_t r = 0; r < rows; ++r) ref::quantize_row(t, src.data() + size_t(r) * cols, out.data() + r * row_bytes, cols);
  return out;
}

class WeightOps : public test::VulkanTest, public ::testing::WithParamInterface<TensorType> {};

TEST_P(WeightOps, MatchReference) {
  const TensorType t = GetParam();
  VulkanContext& ctx = test::vk();
  for (const Shape& s : shapes_for(t)) {
    SCOPED_TRACE(gguf::type_name(t) + " rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols));
    const std::vector<uint8_t> w = quantized(t, test::random_floats(size_t(s.rows) * s.cols, s.rows * 7 + s.cols), s.rows, s.cols);
    const uint64_t row_bytes = gguf::type_bytes(t, s.cols);
    for (uint64_t max_part : {uint64_t{0}, row_bytes * 16}) {  // whole, then split into 16-row parts
      SCOPED_TRACE(max_part ? "split into parts" : "one binding");
      WeightArena arena(ctx, max_part);
      const DeviceTensor dw = arena.upload("w", t, s.cols, s.rows, w.data());
      if (max_part && s.rows > 16) {
        EXPECT_GT(dw.parts.size(), 1u);
      }

      // get_rows
      const std::vector<int32_t> ids = {0, int32_t(s.rows - 1), int32_t(s.rows / 2), 0};
      std::vector<float> want(ids.size() * s.cols);
      ref::get_rows(t, w.data(), s.cols, ids.data(), int64_t(ids.size()), want.data());
      Buffer dids = test::to_device(ids), dout = test::to_device(std::vector<float>(want.size(), 0.0f));
      // matvec (1 token) and matmul (several)
      for (uint32_t n_tokens : {1u, 3u, 5u, 33u, 70u}) {  // 70: two token tiles of the tiled matmul
        const std::vector<float> x = test::random_floats(size_t(n_tokens) * s.cols, n_tokens + s.cols);
        std::vector<float> ywant(size_t(n_tokens) * s.rows);
        ref::matmul(t, w.data(), s.rows, s.cols, x.data(), n_tokens, ywant.data());
        Buffer dx = test::to_device(x), dy = test::to_device(std::vector<float>(ywant.size(), 0.0f));
        // Auto takes matvec_simd on CPU drivers where it applies; Portable the GPU kernels. The
        // accumulating store adds to what y holds (here y0 = 1 + row index).
        std::vector<float> y0(ywant.size()), ysum(ywant.size());
        for (size_t i = 0; i < y0.size(); ++i) y0[i] = 1.0f + float(i % s.rows);
        for (size_t i = 0; i < y0.size(); ++i) ysum[i] = y0[i] + ywant[i];
        Buffer dy0 = test::to_device(y0);
        // PortableGpu: matvec.comp as tuned for GPUs (MatvecTuning's default), several columns per
        // workgroup for a short chunk (beyond it the tiled matmul, as Portable runs it).
        for (MatmulKernel kernel : {MatmulKernel::Auto, MatmulKernel::Portable, MatmulKernel::PortableGpu}) {
          if (kernel == MatmulKernel::PortableGpu && n_tokens > k_matvec_chunk) continue;
          for (MatmulStore store : {MatmulStore::Overwrite, MatmulStore::Accumulate}) {
            CommandRecorder rec(ctx, &test::pipelines());
            rec.copy(dy0.view(), dy.view());
            rec.barrier();
            record_matmul(rec, dw, dx.view(), s.cols, n_tokens, dy.view(), s.rows, store, kernel);
            rec.submit_and_wait();
            const bool acc = store == MatmulStore::Accumulate;
            EXPECT_LE(test::nmse(test::from_device<float>(dy, ywant.size()), acc ? ysum : ywant), 5e-4)
                << "tokens " << n_tokens
                << (kernel == MatmulKernel::Auto ? " auto" : kernel == MatmulKernel::Portable ? " portable" : " portable, GPU-tuned")
                << (acc ? " accumulate" : "");
          }
        }
        // The GPU kernels with x rows a stride of cols + 1 apart: no vec4 loads of x.
        if (n_tokens <= 3) {
          std::vector<float> xp(size_t(n_tokens) * (s.cols + 1), 0.0f);
          for (uint32_t t = 0; t < n_tokens; ++t)
            std::copy(x.begin() + size_t(t) * s.cols, x.begin() + size_t(t + 1) * s.cols, xp.begin() + size_t(t) * (s.cols + 1));
          Buffer dxp = test::to_device(xp);
          CommandRecorder rec(ctx, &test::pipelines());
          record_matmul(rec, dw, dxp.view(), s.cols + 1, n_tokens, dy.view(), s.rows, MatmulStore::Overwrite, MatmulKernel::Portable);
          rec.submit_and_wait();
          EXPECT_LE(test::nmse(test::from_device<float>(dy, ywant.size()), ywant), 5e-4) << "tokens " << n_tokens << " portable, x stride cols + 1";
        }
        // Columns: every column bit for bit what it is alone (the server's batch invariance).
        if (n_tokens > 1 && n_tokens < 33) {
          CommandRecorder rec(ctx, &test::pipelines());
          record_matmul(rec, dw, dx.view(), s.cols, n_tokens, dy.view(), s.rows, MatmulStore::Overwrite, MatmulKernel::Columns);
          rec.submit_and_wait();
          const std::vector<float> batched = test::from_device<float>(dy, ywant.size());
          EXPECT_LE(test::nmse(batched, ywant), 5e-4) << "tokens " << n_tokens << " columns";
          for (uint32_t t = 0; t < n_tokens; ++t) {
            Buffer dx1 = test::to_device(std::vector<float>(x.begin() + size_t(t) * s.cols, x.begin() + size_t(t + 1) * s.cols));
            Buffer dy1 = test::to_device(std::vector<float>(s.rows, 0.0f));
            CommandRecorder one(ctx, &test::pipelines());
            record_matmul(one, dw, dx1.view(), s.cols, 1, dy1.view(), s.rows, MatmulStore::Overwrite, MatmulKernel::Columns);
            one.submit_and_wait();
            const std::vector<float> alone = test::from_device<float>(dy1, s.rows);
            EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batched.begin() + size_t(t) * s.rows))
                << "column " << t << " of " << n_tokens << " differs from the same column alone";
          }
        }
      }
      CommandRecorder rec(ctx, &test::pipelines());
      record_get_rows(rec, dw, dids.view(), uint32_t(ids.size()), dout.view(), s.cols);
      rec.submit_and_wait();
      EXPECT_LE(test::nmse(test::from_device<float>(dout, want.size()), want), 1e-7);
    }
  }
}

// A tensor of rows × cols quantized values, as the GGUF reader describes one.
gguf::TensorInfo tensor_info(const std::string& name, TensorType t, uint32_t cols, uint32_t rows, const std::vector<uint8_t>& data) {
  gguf::TensorInfo info;
  info.name = name;
  info.n_dims = 2;
  info.ne[0] = cols;
  info.ne[1] = rows;
  info.type = t;
  info.n_elements = uint64_t{cols} * rows;
  info.n_bytes = data.size();
  info.data = data.data();
  return info;
}

// Fused projections: q|k|v rows uploaded as one tensor, each piece written to its own region of one
// buffer by one dispatch; gate|up rows with the gated activation (SiLU, GELU) applied in the matvec
// kernels' epilogue, or by swiglu / geglu after the tiled matmul. Each against the reference, and
// against the same projections recorded one by one on the same kernel (q|k|v bit for bit; gate|up
// to 1e-12, as a GPU compiler may contract the activation's arithmetic differently in two shaders).
TEST_P(WeightOps, FusedProjectionsMatchPieces) {
  const TensorType t = GetParam();
  VulkanContext& ctx = test::vk();
  const uint32_t qk = gguf::type_info(static_cast<uint32_t>(t))->block_size;
  for (uint32_t cols : {qk == 1 ? 256u : 512u, qk == 1 ? 40u : (qk == 32 ? 96u : 256u)}) {  // matvec_simd where it applies, and not
    SCOPED_TRACE(gguf::type_name(t) + " cols " + std::to_string(cols));
    const uint32_t rq = 48, rkv = 16, rff = 32;
    std::vector<std::vector<uint8_t>> data;
    for (uint32_t rows : {rq, rkv, rkv, rff, rff})
      data.push_back(quantized(t, test::random_floats(size_t(rows) * cols, rows + cols + data.size()), rows, cols));
    const gguf::TensorInfo wq = tensor_info("q", t, cols, rq, data[0]), wk = tensor_info("k", t, cols, rkv, data[1]),
                           wv = tensor_info("v", t, cols, rkv, data[2]), wg = tensor_info("gate", t, cols, rff, data[3]),
                           wu = tensor_info("up", t, cols, rff, data[4]);
    WeightArena arena(ctx);
    const WeightArena::RowRange qkv_ranges[] = {{&wq, 0, rq}, {&wk, 0, rkv}, {&wv, 0, rkv}};
    const WeightArena::RowRange ffn_ranges[] = {{&wg, 0, rff}, {&wu, 0, rff}};
    const auto qkv = arena.upload_fused("qkv", qkv_ranges);
    const auto ffn = arena.upload_fused("gate_up", ffn_ranges);
    ASSERT_TRUE(qkv && ffn);
    EXPECT_EQ(qkv->whole.rows, rq + 2 * rkv);
    EXPECT_EQ(qkv->pieces[1].name, "k");
    for (uint32_t n : {1u, 3u, 5u, 33u}) {
      SCOPED_TRACE("tokens " + std::to_string(n));
      const std::vector<float> x = test::random_floats(size_t(n) * cols, n * 3 + cols);
      Buffer dx = test::to_device(x);
      std::vector<std::vector<float>> want(5);
      for (size_t i = 0; i < 5; ++i) {
        const uint32_t rows = i == 0 ? rq : i < 3 ? rkv : rff;
        want[i].resize(size_t(n) * rows);
        ref::matmul(t, data[i].data(), rows, cols, x.data(), n, want[i].data());
      }
      for (Glu act : {Glu::SiLU, Glu::GELU}) {
        std::vector<float> glu(size_t(n) * rff);
        for (size_t i = 0; i < glu.size(); ++i) {
          const float g = want[3][i], u = want[4][i];
          glu[i] = act == Glu::SiLU ? g / (1.0f + std::exp(-g)) * u
                                    : 0.5f * g * (1.0f + std::tanh(0.7978845608f * g * (1.0f + 0.044715f * g * g))) * u;
        }
        for (MatmulKernel kernel : {MatmulKernel::Auto, MatmulKernel::Portable, MatmulKernel::Columns, MatmulKernel::PortableGpu}) {
          SCOPED_TRACE(kernel == MatmulKernel::Auto       ? "auto"
                       : kernel == MatmulKernel::Portable ? "portable"
                       : kernel == MatmulKernel::Columns  ? "columns"
                                                          : "portable, GPU-tuned");
          // Regions 1 KiB-aligned past each other's ends, as the engine lays them out.
          const uint64_t q_at = 0, k_at = (n * rq * 4 + 1023) / 1024 * 1024, kv_bytes = n * rkv * 4,
                         v_at = k_at + (kv_bytes + 1023) / 1024 * 1024, ff_bytes = n * rff * 4, up_at = (ff_bytes + 1023) / 1024 * 1024;
          Buffer dqkv = test::to_device(std::vector<float>((v_at + kv_bytes) / 4, 0.0f));
          Buffer dffn = test::to_device(std::vector<float>((up_at + ff_bytes) / 4, 0.0f));
          Buffer dsep = test::to_device(std::vector<float>((up_at + ff_bytes) / 4, 0.0f));
          const BufferView outs[] = {dqkv.view(q_at, n * rq * 4), dqkv.view(k_at, kv_bytes), dqkv.view(v_at, kv_bytes)};
          const uint32_t rows[] = {rq, rkv, rkv};
          CommandRecorder rec(ctx, &test::pipelines());
          record_matmul_split(rec, qkv->whole, dx.view(), cols, n, outs, rows, kernel);
          // The pieces one by one, into the same regions of another buffer.
          Buffer dqkv_sep = test::to_device(std::vector<float>((v_at + kv_bytes) / 4, 0.0f));
          for (size_t i = 0; i < 3; ++i)
            record_matmul(rec, qkv->pieces[i], dx.view(), cols, n, dqkv_sep.view(outs[i].offset, outs[i].range), rows[i],
                          MatmulStore::Overwrite, kernel);
          record_matmul_glu(rec, ffn->whole, dx.view(), cols, n, dffn.view(0, ff_bytes), dffn.view(up_at, ff_bytes),
                            dffn.view(0, ff_bytes), act, kernel);
          // The unfused FFN on the same kernel, from the pieces (views into the fused tensor).
          record_matmul(rec, ffn->pieces[0], dx.view(), cols, n, dsep.view(0, ff_bytes), rff, MatmulStore::Overwrite, kernel);
          record_matmul(rec, ffn->pieces[1], dx.view(), cols, n, dsep.view(up_at, ff_bytes), rff, MatmulStore::Overwrite, kernel);
          rec.barrier();
          if (act == Glu::SiLU) record_swiglu(rec, dsep.view(0, ff_bytes), dsep.view(up_at, ff_bytes), dsep.view(0, ff_bytes), n * rff);
          else record_geglu(rec, dsep.view(0, ff_bytes), dsep.view(up_at, ff_bytes), dsep.view(0, ff_bytes), n * rff);
          rec.submit_and_wait();
          const auto all = test::from_device<float>(dqkv, (v_at + kv_bytes) / 4);
          const auto region = [&](uint64_t at, size_t count) {
            return std::vector<float>(all.begin() + at / 4, all.begin() + at / 4 + count);
          };
          EXPECT_LE(test::nmse(region(q_at, want[0].size()), want[0]), 5e-4) << "q";
          EXPECT_LE(test::nmse(region(k_at, want[1].size()), want[1]), 5e-4) << "k";
          EXPECT_LE(test::nmse(region(v_at, want[2].size()), want[2]), 5e-4) << "v";
          EXPECT_EQ(all, test::from_device<float>(dqkv_sep, all.size())) << "q|k|v fused against one by one";
          const auto fused = test::from_device<float>(dffn, glu.size());
          EXPECT_LE(test::nmse(fused, glu), 5e-4) << "gate|up";
          EXPECT_LE(test::nmse(fused, test::from_device<float>(dsep, glu.size())), 1e-12) << "gate|up fused against one by one";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, WeightOps, ::testing::ValuesIn(k_types),
                         [](const auto& info) { return gguf::type_name(info.param); });

using WeightKernels = test::VulkanTest;

TEST_F(WeightKernels, UnsupportedWeightTypeIsNamed) {
  DeviceTensor w;
  w.name = "blk.0.ffn_up.weight";
  w.type = TensorType::IQ2_XS;
  try {
    weight_kernel_suffix(w);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tensor 'blk.0.ffn_up.weight' has type IQ2_XS, which vkllm cannot run yet");
  }
}

// matvec.comp under tunings a GPU sweep tries (MatvecTuning; set_matvec_tuning as VKLLM_MATVEC
// would): several rows per subgroup, rows split over subgroups whose sums meet in shared memory,
// more subgroups per row group than the workgroup has (lavapipe's subgroups are 8 wide, so
// wg=32 has 4), each piece path of the shader; overwrite, accumulate and a gate|up pair, against the
// reference.
TEST_F(WeightKernels, EveryMatvecTuningMatchesTheReference) {
  VulkanContext& ctx = test::vk();
  struct Reset {
    ~Reset() { set_matvec_tuning(std::nullopt); }
  } reset;
  // The last two read x as 8-bit blocks for Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K (q8x); the others ignore it.
  // Columns per workgroup: 2, 4, 2, 8, 4, 1 (one column: a layer per column, the tiled matmul for
  // chunks), each with few enough pieces in flight and rows that lavapipe compiles it in seconds.
  const MatvecTuning tunings[] = {{64, 4, 2, 1, 0, 2}, {128, 2, 1, 4, 0, 4}, {256, 8, 2, 2, 0, 2}, {32, 1, 3, 8, 0, 8},
                                  {128, 2, 1, 2, 1, 4}, {64, 4, 2, 1, 1, 1}};
  const TensorType types[] = {TensorType::F16,  TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_1, TensorType::Q8_0,
                              TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::IQ4_XS};
  // (Rows: whole 16-byte runs in every type, as a fused upload needs; cols: enough pieces that eight
  // in flight per lane run their loop on 8-wide subgroups.)
  const uint32_t rows = 44, cols = 2048;
  if (!ctx.info().int_dot)
    std::fprintf(stderr, "note: %s has no shaderIntegerDotProduct: the q8x tunings run the f32 path here\n", ctx.info().name.c_str());
  const std::vector<float> x = test::random_floats(cols, 11);
  Buffer dx = test::to_device(x);
  // Five columns, and three of them (4, 0, 2) in that order.
  const std::vector<float> x5 = test::random_floats(size_t(5) * cols, 12);
  const uint32_t reordered[] = {4, 0, 2};
  std::vector<float> x3;
  for (uint32_t c : reordered) x3.insert(x3.end(), x5.begin() + size_t(c) * cols, x5.begin() + size_t(c + 1) * cols);
  Buffer dx5 = test::to_device(x5), dx3 = test::to_device(x3);
  for (TensorType t : types) {
    const std::vector<uint8_t> w = quantized(t, test::random_floats(size_t(2) * rows * cols, 5), 2 * rows, cols);
    std::vector<float> want(2 * rows), glu(rows), y0(rows), ysum(rows);
    ref::matmul(t, w.data(), 2 * rows, cols, x.data(), 1, want.data());
    const auto silu_glu = [](float g, float u) { return g / (1.0f + std::exp(-g)) * u; };
    for (uint32_t r = 0; r < rows; ++r) {
      glu[r] = silu_glu(want[r], want[rows + r]);
      y0[r] = 1.0f + float(r);
      ysum[r] = y0[r] + want[r];
    }
    const std::vector<float> first(want.begin(), want.begin() + rows);
    // The five columns' gate rows and gated activation ([5][2 rows] from the reference: gate, then up).
    std::vector<float> y5(size_t(10) * rows), gate5(size_t(5) * rows), glu5(size_t(5) * rows);
    ref::matmul(t, w.data(), 2 * rows, cols, x5.data(), 5, y5.data());
    for (uint32_t c = 0; c < 5; ++c)
      for (uint32_t r = 0; r < rows; ++r) {
        gate5[size_t(c) * rows + r] = y5[size_t(c) * 2 * rows + r];
        glu5[size_t(c) * rows + r] = silu_glu(y5[size_t(c) * 2 * rows + r], y5[size_t(c) * 2 * rows + rows + r]);
      }
    WeightArena arena(ctx);
    const std::vector<uint8_t> gate_rows(w.begin(), w.begin() + w.size() / 2), up_rows(w.begin() + w.size() / 2, w.end());
    const gguf::TensorInfo wg = tensor_info("gate", t, cols, rows, gate_rows), wu = tensor_info("up", t, cols, rows, up_rows);
    const WeightArena::RowRange ranges[] = {{&wg, 0, rows}, {&wu, 0, rows}};
    const auto ffn = arena.upload_fused("gate_up", ranges);
    ASSERT_TRUE(ffn);
    for (const MatvecTuning& tuning : tunings) {
      SCOPED_TRACE(gguf::type_name(t) + " wg " + std::to_string(tuning.wg) + " in_flight " + std::to_string(tuning.in_flight) +
                   " rps " + std::to_string(tuning.rps) + " split " + std::to_string(tuning.split) + " q8x " +
                   std::to_string(tuning.q8x) + " cols " + std::to_string(tuning.cols));
      set_matvec_tuning(tuning);
      ASSERT_EQ(matvec_tuning(ctx, MatmulKernel::PortableGpu), tuning);
      Buffer dy = test::to_device(std::vector<float>(rows, 0.0f)), dacc = test::to_device(y0);
      Buffer dgate = test::to_device(std::vector<float>(2 * rows, 0.0f));
      CommandRecorder rec(ctx, &test::pipelines());
      record_matmul(rec, ffn->pieces[0], dx.view(), cols, 1, dy.view(), rows, MatmulStore::Overwrite, MatmulKernel::PortableGpu);
      record_matmul(rec, ffn->pieces[0], dx.view(), cols, 1, dacc.view(), rows, MatmulStore::Accumulate, MatmulKernel::PortableGpu);
      record_matmul_glu(rec, ffn->whole, dx.view(), cols, 1, dgate.view(0, rows * 4), dgate.view(rows * 4, rows * 4),
                        dgate.view(0, rows * 4), Glu::SiLU, MatmulKernel::PortableGpu);
      rec.submit_and_wait();
      EXPECT_LE(test::nmse(test::from_device<float>(dy, rows), first), 5e-4) << "overwrite";
      EXPECT_LE(test::nmse(test::from_device<float>(dacc, rows), ysum), 5e-4) << "accumulate";
      EXPECT_LE(test::nmse(test::from_device<float>(dgate, rows), glu), 5e-4) << "gate|up";
      // The 8-bit path taken where it applies: its rounding of x makes the result differ from the
      // same shape's with f32 x.
      const bool q8_type = t == TensorType::Q4_0 || t == TensorType::Q4_1 || t == TensorType::Q8_0 || t == TensorType::Q4_K ||
                           t == TensorType::Q5_K || t == TensorType::Q6_K;
      if (tuning.q8x && q8_type && ctx.info().int_dot) {
        MatvecTuning f32x = tuning;
        f32x.q8x = 0;
        set_matvec_tuning(f32x);
        Buffer dy2 = test::to_device(std::vector<float>(rows, 0.0f));
        CommandRecorder rec2(ctx, &test::pipelines());
        record_matmul(rec2, ffn->pieces[0], dx.view(), cols, 1, dy2.view(), rows, MatmulStore::Overwrite, MatmulKernel::PortableGpu);
        rec2.submit_and_wait();
        EXPECT_NE(test::from_device<float>(dy, rows), test::from_device<float>(dy2, rows)) << "8-bit x not taken";
        set_matvec_tuning(tuning);
      }
      // Several columns per workgroup (tuning.cols; a prompt chunk of up to k_matvec_chunk tokens):
      // five columns against the reference, then three of them in another order (another layer,
      // position and count of live columns), bit for bit the same (batch invariance).
      Buffer dy5 = test::to_device(std::vector<float>(gate5.size(), 0.0f)), dy3 = test::to_device(std::vector<float>(size_t(3) * rows, 0.0f));
      Buffer dglu5 = test::to_device(std::vector<float>(size_t(10) * rows, 0.0f));
      CommandRecorder rec5(ctx, &test::pipelines());
      record_matmul(rec5, ffn->pieces[0], dx5.view(), cols, 5, dy5.view(), rows, MatmulStore::Overwrite, MatmulKernel::PortableGpu);
      record_matmul(rec5, ffn->pieces[0], dx3.view(), cols, 3, dy3.view(), rows, MatmulStore::Overwrite, MatmulKernel::PortableGpu);
      record_matmul_glu(rec5, ffn->whole, dx5.view(), cols, 5, dglu5.view(0, size_t(5) * rows * 4),
                        dglu5.view(size_t(5) * rows * 4, size_t(5) * rows * 4), dglu5.view(0, size_t(5) * rows * 4), Glu::SiLU,
                        MatmulKernel::PortableGpu);
      rec5.submit_and_wait();
      const std::vector<float> got5 = test::from_device<float>(dy5, gate5.size()), got3 = test::from_device<float>(dy3, size_t(3) * rows);
      EXPECT_LE(test::nmse(got5, gate5), 5e-4) << "5 columns";
      EXPECT_LE(test::nmse(test::from_device<float>(dglu5, glu5.size()), glu5), 5e-4) << "gate|up, 5 columns";
      for (uint32_t i = 0; i < 3; ++i)
        EXPECT_TRUE(std::equal(got3.begin() + i * rows, got3.begin() + (i + 1) * rows, got5.begin() + reordered[i] * rows))
            << "column " << reordered[i] << " of 5 differs as column " << i << " of 3";
    }
  }
}

TEST_F(WeightKernels, MatvecTuningTextIsCheckedPartByPart) {
  EXPECT_EQ(parse_matvec_tuning("wg=256,split=4"), (MatvecTuning{256, 2, 1, 4}));
  EXPECT_EQ(parse_matvec_tuning("in_flight=8,rps=1", {64, 1, 1, 1}), (MatvecTuning{64, 8, 1, 1}));
  EXPECT_EQ(parse_matvec_tuning(""), MatvecTuning{});
  EXPECT_EQ(parse_matvec_tuning("q8x=1").q8x, 1u);
  const auto error_of = [](const char* text) {
    try {
      parse_matvec_tuning(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("wg=96"), "VKLLM_MATVEC=\"wg=96\": 'wg=96' must be a power of two from 32 to 1024");
  EXPECT_EQ(error_of("rps=2,in_flight=3"), "VKLLM_MATVEC=\"rps=2,in_flight=3\": 'in_flight=3' must be 1, 2, 4 or 8");
  EXPECT_EQ(error_of("split"), "VKLLM_MATVEC=\"split\": 'split' is not name=value");
  EXPECT_EQ(error_of("q8x=2"), "VKLLM_MATVEC=\"q8x=2\": 'q8x=2' must be 0 or 1");
  EXPECT_EQ(error_of("rps=two"), "VKLLM_MATVEC=\"rps=two\": 'rps=two' has no whole number");
  EXPECT_EQ(error_of("cols=3"), "VKLLM_MATVEC=\"cols=3\": 'cols=3' must be 1, 2, 4 or 8");
  EXPECT_EQ(parse_matvec_tuning("cols=8,wg=64"), (MatvecTuning{64, 2, 1, 2, 0, 8}));
  EXPECT_EQ(error_of("rows=2"), "VKLLM_MATVEC=\"rows=2\": 'rows=2' names none of wg, in_flight, rps, split, q8x, cols");
}

// bench --ops' read ceiling reads every word once in either layout (a 4 KiB run per invocation, or
// words strided by the invocations as on GPUs), through storage-buffer and texel loads: the XOR of
// its outputs is the XOR of the data, which a word skipped or read twice would change.
TEST_F(WeightKernels, ReadCeilingReadsEveryWordOnce) {
  VulkanContext& ctx = test::vk();
  const uint32_t n_words = 5000;  // uvec4 words: neither layout's multiple
  std::vector<uint32_t> data(size_t(n_words) * 4);
  std::mt19937 rng(7);
  for (uint32_t& v : data) v = rng();
  uint32_t want = 0;
  for (uint32_t v : data) want ^= v;
  Buffer dd = test::to_device(data);
  for (bool strided : {false, true}) {
    for (bool texel : {false, true}) {
      const uint64_t out_bytes = read_ceiling_out_bytes(ctx, dd.size(), strided);
      Buffer dout = test::to_device(std::vector<uint32_t>(out_bytes / 4, 0u));
      CommandRecorder rec(ctx, &test::pipelines());
      record_read_ceiling(rec, dd.view(), dout.view(), texel, strided);
      rec.submit_and_wait();
      uint32_t got = 0;
      for (uint32_t v : test::from_device<uint32_t>(dout, out_bytes / 4)) got ^= v;
      EXPECT_EQ(got, want) << (strided ? "strided" : "runs") << (texel ? ", texel loads" : ", storage-buffer loads");
    }
  }
}

// What a model load prepares (matmul_pipelines) is what record_matmul then takes: on CPU drivers the
// matvec_simd kernels for one column and for a group, for weights whose rows are whole units (and
// nothing for others, nor on GPUs, where nothing is prepared). A spec that drifted from the one
// recorded would be made for nothing and the recorded one made on the spot.
TEST_F(WeightKernels, PreparedMatmulPipelinesAreTheOnesRecorded) {
  VulkanContext& ctx = test::vk();
  for (const auto& [type, s] : {std::pair{TensorType::Q4_0, Shape{40, 512}}, std::pair{TensorType::Q4_K, Shape{40, 2304}},
                                std::pair{TensorType::Q8_0, Shape{40, 96}}}) {
    SCOPED_TRACE(gguf::type_name(type) + " cols " + std::to_string(s.cols));
    const std::vector<uint8_t> w = quantized(type, test::random_floats(size_t(s.rows) * s.cols, s.cols), s.rows, s.cols);
    WeightArena arena(ctx);
    const DeviceTensor dw = arena.upload("w", type, s.cols, s.rows, w.data());
    Pipelines pipes(ctx, "");
    for (uint32_t n_tokens : {1u, 5u}) {
      Buffer dx = test::to_device(ctx, test::random_floats(size_t(n_tokens) * s.cols, n_tokens));
      Buffer dy = test::to_device(ctx, std::vector<float>(size_t(n_tokens) * s.rows, 0.0f));
      CommandRecorder rec(ctx, &pipes);
      record_matmul(rec, dw, dx.view(), s.cols, n_tokens, dy.view(), s.rows);
      rec.submit_and_wait();
    }
    std::vector<std::string> prepared;
    for (const PipelineSpec& p : matmul_pipelines(ctx, type, s.cols)) prepared.push_back(p.key());
    std::sort(prepared.begin(), prepared.end());
    std::vector<std::string> recorded;
    for (const std::string& k : pipes.made())
      if (k.rfind("matvec_simd_", 0) == 0) recorded.push_back(k);
    EXPECT_EQ(prepared, recorded);
    EXPECT_EQ(prepared.empty(), ctx.info().type != "cpu" || s.cols % 256 != 0);
  }
}

// A submit that runs a pipeline for the first time reports its wait (CPU drivers compile a kernel
// when they first run it: the first prompt's status line): with no threshold, a 64 MiB read is
// reported at least once, then done (-1); the same pipeline's next submit is not reported.
TEST_F(WeightKernels, FirstUseOfAPipelineReportsItsWait) {
  VulkanContext& ctx = test::vk();
  Pipelines pipes(ctx, "");  // its own: every pipeline new to it
  std::vector<double> calls;
  pipes.set_first_use_wait([&](double s) { calls.push_back(s); }, std::chrono::milliseconds(0));
  const uint64_t bytes = 64ull << 20;
  Buffer data(ctx, bytes, MemoryUse::Device, "first-use data");
  Buffer out(ctx, read_ceiling_out_bytes(ctx, bytes), MemoryUse::Device, "first-use sink");
  // Records (creating the pipeline), then times the submit alone.
  auto run = [&] {
    CommandRecorder rec(ctx, &pipes);
    for (uint64_t off = 0; off < bytes; off += ctx.max_storage_range())
      record_read_ceiling(rec, data.view(off, std::min<uint64_t>(ctx.max_storage_range(), bytes - off)), out.view(), false);
    const auto start = std::chrono::steady_clock::now();
    rec.submit_and_wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // A CPU driver compiles the kernel during this first submit (seconds), which must be reported; a
  // GPU driver that compiled it at creation may finish within the first 1 ms poll, unreported.
  const double waited = run();
  if (calls.empty()) {
    EXPECT_LT(waited, 0.005) << "a first submit of " << waited << " s was not reported";
  } else {
    EXPECT_EQ(calls.back(), -1.0);
  }
  for (size_t i = 0; i + 1 < calls.size(); ++i) EXPECT_GE(calls[i], 0.0);
  EXPECT_TRUE(pipes.get("read_ceiling", 2, sizeof(ReadCeilingParams), {64}).submitted());
  calls.clear();
  run();
  EXPECT_TRUE(calls.empty()) << "the second submit of the same pipeline was reported";
}

// On CPU drivers, Q4_0 rows of whole 256-element units take matvec_simd, which rounds each block of
// x to 9 bits and sums in integers, two columns per 32-bit multiply or, where a 64-bit multiply is one
// instruction (DeviceInfo::wide_int64), four per 64-bit one (docs/shaders.md). It must equal that
// computation to float rounding: far tighter than the 5e-4 allowed against the f32 reference, where
// the rounding of x alone is ~1e-6. Both packings run on every CPU driver with shaderInt64 (a second
// context forces the one this host does not choose) and give the same floats bit for bit: the same
// integers, the same float arithmetic after them.
std::vector<float> q4_0_simd_results(VulkanContext& ctx, Pipelines& pipelines, const std::vector<uint8_t>& w, const Shape& s,
                                     const std::vector<float>& x, uint32_t n_tokens) {
  WeightArena arena(ctx);
  const DeviceTensor dw = arena.upload("w", TensorType::Q4_0, s.cols, s.rows, w.data());
  Buffer dx = test::to_device(ctx, x), dy = test::to_device(ctx, std::vector<float>(size_t(n_tokens) * s.rows, 0.0f));
  CommandRecorder rec(ctx, &pipelines);
  record_matmul(rec, dw, dx.view(), s.cols, n_tokens, dy.view(), s.rows);
  rec.submit_and_wait();
  return test::from_device<float>(ctx, dy, size_t(n_tokens) * s.rows);
}

TEST_F(WeightKernels, Q4_0OnCpuDriversMatchesNineBitActivations) {
  VulkanContext& ctx = test::vk();
  if (ctx.info().type != "cpu") GTEST_SKIP() << "matvec_simd runs on CPU drivers only; this device is " << ctx.info().type;
  // The other packing, where this driver has shaderInt64 (without it there is only the 32-bit one).
  std::unique_ptr<VulkanContext> other;
  std::unique_ptr<Pipelines> other_pipelines;
  if (ctx.info().int64) {
    ContextOptions other_options;
    other_options.wide_int64 = !ctx.info().wide_int64;
    other = std::make_unique<VulkanContext>(other_options);
    other_pipelines = std::make_unique<Pipelines>(*other, "");
    ASSERT_NE(other->info().wide_int64, ctx.info().wide_int64);
  }
  // (16,448 rows: at least 512 rows per workgroup on up to 8 CPUs, 2,048 on 2, more than the 256
  // of before, and a last workgroup cut short.)
  for (const Shape& s : {Shape{37, 512}, Shape{9, 2304}, Shape{2048, 256}, Shape{16448, 256}}) {
    const std::vector<uint8_t> w = quantized(TensorType::Q4_0, test::random_floats(size_t(s.rows) * s.cols, s.rows + s.cols), s.rows, s.cols);
    for (uint32_t n_tokens : {1u, 4u, 7u}) {
      SCOPED_TRACE("rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols) + " tokens " + std::to_string(n_tokens));
      std::vector<float> x = test::random_floats(size_t(n_tokens) * s.cols, 3 * n_tokens + s.cols);
      for (size_t i = 0; i < 32; ++i) x[i] = 0.0f;  // a block of zeros: scale 0
      std::vector<float> want(size_t(n_tokens) * s.rows), exact(want.size());
      ref::matmul_q4_0_x9(w.data(), s.rows, s.cols, x.data(), n_tokens, want.data());
      ref::matmul(TensorType::Q4_0, w.data(), s.rows, s.cols, x.data(), n_tokens, exact.data());
      const std::vector<float> got = q4_0_simd_results(ctx, test::pipelines(), w, s, x, n_tokens);
      EXPECT_LE(test::nmse(got, want), 1e-11);
      EXPECT_GT(test::nmse(got, exact), 1e-9) << "not the 9-bit path";
      if (other) {
        EXPECT_TRUE(got == q4_0_simd_results(*other, *other_pipelines, w, s, x, n_tokens))
            << "the 64-bit packing (wide_int64) and the 32-bit one differ";
      }
    }
  }
  // A NaN or an infinity in a column's x makes that column's results NaN, as float activations
  // would, and leaves the columns that share its integers untouched, in both packings.
  const Shape s{37, 512};
  const std::vector<uint8_t> w = quantized(TensorType::Q4_0, test::random_floats(size_t(s.rows) * s.cols, 5), s.rows, s.cols);
  for (float bad : {std::nanf(""), INFINITY}) {
    std::vector<float> x = test::random_floats(size_t(4) * s.cols, 11);
    x[40] = bad;  // column 0
    std::vector<float> want(size_t(4) * s.rows);
    ref::matmul_q4_0_x9(w.data(), s.rows, s.cols, x.data() + s.cols, 3, want.data() + s.rows);  // columns 1–3
    for (bool mine : {true, false}) {
      if (!mine && !other) continue;
      SCOPED_TRACE((mine ? ctx.info().wide_int64 : other->info().wide_int64) ? "64-bit packing" : "32-bit packing");
      const std::vector<float> got =
          mine ? q4_0_simd_results(ctx, test::pipelines(), w, s, x, 4) : q4_0_simd_results(*other, *other_pipelines, w, s, x, 4);
      for (uint32_t r = 0; r < s.rows; ++r) EXPECT_TRUE(std::isnan(got[r])) << "row " << r << " of the column with " << bad;
      const std::vector<float> rest(got.begin() + s.rows, got.end()), rest_want(want.begin() + s.rows, want.end());
      EXPECT_LE(test::nmse(rest, rest_want), 1e-11) << "the other columns, with " << bad << " in column 0";
    }
  }
}

}  // namespace
