// Helpers for the shader op tests.
#include "op_test_util.h"

namespace vkllm::test {

double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    err += d * d;
    ref += double(b[i]) * double(b[i]);
  }
  if (a.size() != b.size()) return 1e30;
  return ref > 0 ? err / ref : err;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace vkllm::test
