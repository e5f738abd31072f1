// Element-wise and row shaders (add, mul, scale, softcap, swiglu, geglu, rms_norm, softmax, argmax) against the
// scalar references, over sizes that are not multiples of the workgroup size.
#include <gtest/gtest.h>

#include "op_test_util.h"
#include "kernels/ops.h"
#include "reference/ref_ops.h"

using namespace vkllm;

namespace {

using ElementwiseOps = test::VulkanTest;
const uint32_t k_sizes[] = {1, 7, 255, 256, 1000, 70001};

TEST_F(ElementwiseOps, AddMulBroadcast) {
  for (uint32_t n : k_sizes) {
    for (uint32_t period : {n, std::min<uint32_t>(n, 13u)}) {
      if (n % period) continue;
      const auto a = test::random_floats(n, n), b = test::random_floats(period, n + 1);
      std::vector<float> bb(n), want_add(n), want_mul(n);
      for (uint32_t i = 0; i < n; ++i) bb[i] = b[i % period];
      ref::add(a.data(), bb.data(), n, want_add.data());
      ref::mul(a.data(), bb.data(), n, want_mul.data());
      Buffer da = test::to_device(a), db = test::to_device(b), o1 = test::to_device(std::vector<float>(n)), o2 = test::to_device(std::vector<float>(n));
      CommandRecorder rec(test::vk(), &test::pipelines());
      record_add(rec, da.view(), db.view(), o1.view(), n, period);
      record_mul(rec, da.view(), db.view(), o2.view(), n, period);
      rec.submit_and_wait();
      EXPECT_LE(test::nmse(test::from_device<float>(o1, n), want_add), 1e-7) << n;
      EXPECT_LE(test::nmse(test::from_device<float>(o2, n), want_mul), 1e-7) << n;
    }
  }
}

TEST_F(ElementwiseOps, GegluAndSoftcap) {
  for (uint32_t n : k_sizes) {
    const auto x = test::random_floats(n, n + 5, -12, 12), up = test::random_floats(n, n + 6);
    std::vector<float> want_geglu(n), want_cap(n);
    ref::geglu(x.data(), up.data(), n, want_geglu.data());
    ref::softcap(x.data(), 5.0f, n, want_cap.data());
    Buffer dx = test::to_device(x), dup = test::to_device(up), dx2 = test::to_device(x);
    CommandRecorder rec(test::vk(), &test::pipelines());
    record_geglu(rec, dx.view(), dup.view(), dx.view(), n);  // in place
    record_softcap(rec, dx2.view(), dx2.view(), n, 5.0f);
    rec.submit_and_wait();
    EXPECT_LE(test::nmse(test::from_device<float>(dx, n), want_geglu), 1e-7) << n;
    EXPECT_LE(test::nmse(test::from_device<float>(dx2, n), want_cap), 1e-7) << n;
  }
}

TEST_F(ElementwiseOps, ScaleSwigluInPlace) {
  for (uint32_t n : k_sizes) {
    const auto x = test::random_floats(n, n, -6, 6), up = test::random_floats(n, n + 2);
    std::vector<float> want_scale(n), want_swiglu(n);
    ref::scale(x.data(), -0.37f, n, want_scale.data());
    ref::swiglu(x.data(), up.data(), n, want_swiglu.data());
    Buffer dx = test::to_device(x), dup = test::to_device(up), dx2 = test::to_device(x);
    CommandRecorder rec(test::vk(), &test::pipelines());
    record_scale(rec, dx.view(), dx.view(), n, -0.37f);  // in place
    record_swiglu(rec, dx2.view(), dup.view(), dx2.view(), n);
    rec.submit_and_wait();
    EXPECT_LE(test::nmse(test::from_device<float>(dx, n), want_scale), 1e-7) << n;
    EXPECT_LE(test::nmse(test::from_device<float>(dx2, n), want_swiglu), 1e-7) << n;
  }
}

TEST_F(ElementwiseOps, RowOps) {
  for (uint32_t cols : {1u, 8u, 64u, 172u, 1000u, 32000u}) {
    const uint32_t rows = 3;
    const auto x = test::random_floats(size_t(rows) * cols, cols, -5, 5), w = test::random_floats(cols, cols + 1);
    std::vector<float> want_norm(x.size()), want_soft(x.size());
    std::vector<int32_t> want_arg(rows);
    ref::rms_norm(x.data(), w.data(), rows, cols, 1e-5f, want_norm.data());
    for (uint32_t r = 0; r < rows; ++r) {
      ref::softmax(x.data() + size_t(r) * cols, cols, want_soft.data() + size_t(r) * cols);
      want_arg[r] = int32_t(ref::argmax(x.data() + size_t(r) * cols, cols));
    }
    Buffer dx = test::to_device(x), dw = test::to_device(w), dn = test::to_device(std::vector<float>(x.size())),
           ds = test::to_device(std::vector<float>(x.size())), da = test::to_device(std::vector<int32_t>(rows));
    CommandRecorder rec(test::vk(), &test::pipelines());
    record_rms_norm(rec, dx.view(), cols, dw.view(), dn.view(), cols, rows, cols, 1e-5f);
    record_softmax(rec, dx.view(), ds.view(), rows, cols);
    record_argmax(rec, dx.view(), da.view(), rows, cols);
    rec.submit_and_wait();
    EXPECT_LE(test::nmse(test::from_device<float>(dn, x.size()), want_norm), 1e-7) << cols;
    EXPECT_LE(test::nmse(test::from_device<float>(ds, x.size()), want_soft), 1e-7) << cols;
    EXPECT_EQ(test::from_device<int32_t>(da, rows), want_arg) << cols;
  }
}

// The engine's norms in place on rows that start past the buffer's start and are further apart
// than they are long (q_norm on q's heads, the output norm on its rows): on CPU drivers the texel
// variant, with x and out bound as their whole buffer and found at a base.
TEST_F(ElementwiseOps, RmsNormInPlaceAtAnOffsetWithAStride) {
  const uint32_t rows = 5, cols = 64, stride = 72, first = 16;
  const auto all = test::random_floats(first + size_t(rows) * stride, 7, -3, 3), w = test::random_floats(cols, 8);
  std::vector<float> x(size_t(rows) * cols), want(x.size());
  for (uint32_t r = 0; r < rows; ++r)
    std::copy_n(all.begin() + first + size_t(r) * stride, cols, x.begin() + size_t(r) * cols);
  ref::rms_norm(x.data(), w.data(), rows, cols, 1e-6f, want.data());
  Buffer dx = test::to_device(all), dw = test::to_device(w);
  const BufferView rows_view = dx.view().sub(first * 4, uint64_t(rows) * stride * 4);
  CommandRecorder rec(test::vk(), &test::pipelines());
  record_rms_norm(rec, rows_view, stride, dw.view(), rows_view, stride, rows, cols, 1e-6f);
  rec.submit_and_wait();
  const auto got_all = test::from_device<float>(dx, all.size());
  std::vector<float> got(x.size());
  for (uint32_t r = 0; r < rows; ++r) {
    std::copy_n(got_all.begin() + first + size_t(r) * stride, cols, got.begin() + size_t(r) * cols);
    // Between the rows and before the first, nothing is written.
    for (uint32_t c = cols; c < stride && r + 1 < rows; ++c)
      EXPECT_EQ(got_all[first + size_t(r) * stride + c], all[first + size_t(r) * stride + c]) << r << " " << c;
  }
  for (uint32_t i = 0; i < first; ++i) EXPECT_EQ(got_all[i], all[i]) << i;
  EXPECT_LE(test::nmse(got, want), 1e-7);
}

TEST_F(ElementwiseOps, ArgmaxTakesTheFirstOfTies) {
  std::vector<float> x(1000, 0.5f);
  x[17] = x[400] = x[999] = 3.0f;
  Buffer dx = test::to_device(x), da = test::to_device(std::vector<int32_t>(1));
  CommandRecorder rec(test::vk(), &test::pipelines());
  record_argmax(rec, dx.view(), da.view(), 1, 1000);
  rec.submit_and_wait();
  EXPECT_EQ(test::from_device<int32_t>(da, 1)[0], 17);
}

}  // namespace
