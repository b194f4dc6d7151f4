// OpenBLAS links and runs: cblas_sgemm agrees with a naive triple loop.
#include <cblas.h>

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace {

TEST(OpenblasSmoke, SgemmMatchesNaive) {
  const int m = 7, n = 5, k = 13;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> a(m * k), b(k * n), c(m * n, 0.f);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a.data(), k, b.data(), n,
              0.f, c.data(), n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0;
      for (int p = 0; p < k; ++p) want += double(a[i * k + p]) * b[p * n + j];
      EXPECT_NEAR(c[i * n + j], want, 1e-5) << i << "," << j;
    }
  }
}

}  // namespace
