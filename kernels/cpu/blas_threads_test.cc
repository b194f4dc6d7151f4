#include "kernels/cpu/blas_threads.h"

#include <cblas.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kernels::cpu {
namespace {

// A machine with AVX2 runs OpenBLAS's kernels for its features, not the SSE3 ones Debian's
// OpenBLAS falls back to for CPUs it does not know; and they still multiply right.
TEST(Blas, KernelsFitTheCpuAndMultiplyRight) {
  __builtin_cpu_init();
  const std::string core = BlasCore();
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_NE(core, "Prescott");
  }
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> g;
  constexpr int m = 37, n = 53, k = 71;
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (float& x : a) x = g(rng);
  for (float& x : b) x = g(rng);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a.data(), k, b.data(), n,
              0.f, c.data(), n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0;
      for (int l = 0; l < k; ++l) want += double(a[i * k + l]) * b[l * n + j];
      ASSERT_NEAR(c[i * n + j], want, 1e-4 * (1 + std::abs(want))) << core;
    }
  }
}

}  // namespace
}  // namespace sluice::kernels::cpu
