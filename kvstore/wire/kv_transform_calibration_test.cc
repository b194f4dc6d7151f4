#include "kvstore/wire/kv_transform_calibration.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

model::LlamaConfig SmallConfig() {
  model::LlamaConfig c;
  c.heads = 6;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.rope_dim = 8;
  c.rope_theta = 10000.f;
  return c;
}

// One query position (0): no rotation, so the metric of kv-head h is the sum of its query heads'
// outer products, exactly, and nothing couples two kv-heads.
TEST(KvKeyMetric, OneQueryGivesItsHeadsOuterProducts) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> g;
  const model::LlamaConfig c = SmallConfig();
  const int64_t d = c.head_dim, dim = c.kv_heads * d, group = c.heads / c.kv_heads;
  std::vector<float> q(c.heads * d);
  for (float& x : q) x = g(rng);
  const std::vector<double> m = KvKeyMetric(c, q, 1);
  ASSERT_EQ(m.size(), static_cast<size_t>(dim * dim));
  for (int64_t i = 0; i < dim; ++i) {
    for (int64_t j = 0; j < dim; ++j) {
      double want = 0;
      if (i / d == j / d) {
        const int64_t h = i / d;
        for (int64_t k = 0; k < group; ++k) {
          const float* x = q.data() + (h * group + k) * d;
          want += static_cast<double>(x[i % d]) * x[j % d];
        }
      }
      ASSERT_NEAR(m[i * dim + j], want, 1e-5 * (1 + std::fabs(want))) << i << " " << j;
    }
  }
}

// Queries spread over positions: a query's energy in a RoPE pair stays in that pair (and its
// kv-head), and a fast-turning pair is met from every angle, so its block is nearly isotropic;
// the slowest pair barely turns over 64 positions and keeps the queries' direction.
TEST(KvKeyMetric, RotationsSpreadAPairsEnergyWithinThePair) {
  const model::LlamaConfig c = SmallConfig();
  const int64_t d = c.head_dim, dim = c.kv_heads * d, n = 64;
  std::vector<float> q(n * c.heads * d, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    // Query head 1 (kv-head 0): (1, 0) in the fastest pair (dims 0, 1) and in the slowest (6, 7),
    // both rotated to position t as the model would.
    float* x = q.data() + (t * c.heads + 1) * d;
    const double slow = std::pow(c.rope_theta, -6.0 / d);
    x[0] = static_cast<float>(std::cos(t * 1.0));
    x[1] = static_cast<float>(std::sin(t * 1.0));
    x[6] = static_cast<float>(std::cos(t * slow));
    x[7] = static_cast<float>(std::sin(t * slow));
  }
  const std::vector<double> m = KvKeyMetric(c, q, n);
  const auto at = [&](int64_t i, int64_t j) { return m[i * dim + j]; };
  for (int64_t i = 0; i < dim; ++i) {
    for (int64_t j = 0; j < dim; ++j) {
      const auto used = [](int64_t x) { return x < 2 || (x >= 6 && x < 8); };
      if (!used(i) || !used(j)) ASSERT_NEAR(at(i, j), 0.0, 1e-6) << i << " " << j;
    }
  }
  // Unit queries: each pair's block has trace 1.
  EXPECT_NEAR(at(0, 0) + at(1, 1), 1.0, 1e-4);
  EXPECT_NEAR(at(6, 6) + at(7, 7), 1.0, 1e-4);
  EXPECT_NEAR(at(0, 0), 0.5, 0.15);
  EXPECT_NEAR(at(0, 1), 0.0, 0.15);
  // R(-p) R(t) = R(t - p): the slow pair turns by well under a radian, so stays near (1, 0).
  EXPECT_GT(at(6, 6), 0.95);
}

}  // namespace
}  // namespace sluice::kvstore
