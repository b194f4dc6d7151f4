// sluice eval's metrics against values worked out by hand.
#include "tools/eval_metrics.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::tools {
namespace {

TEST(EvalMetrics, IdenticalLogitsAgreeWithNoDivergence) {
  const std::vector<float> x = {1.f, 3.f, -2.f, 0.5f};
  const TokenMetrics m = CompareLogits(x.data(), x.data(), 4, 1);
  EXPECT_EQ(m.kl, 0.0);
  EXPECT_TRUE(m.top1);
  EXPECT_DOUBLE_EQ(m.nll, m.nll_ref);
  // p(1) = e^3 / (e^1 + e^3 + e^-2 + e^0.5)
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(-2.0) + std::exp(0.5);
  EXPECT_NEAR(m.nll, -(3.0 - std::log(z)), 1e-12);
}

TEST(EvalMetrics, KlOfTwoKnownDistributions) {
  // Reference (1/2, 1/2), tested (1/4, 3/4): KL = 1/2 ln(2) + 1/2 ln(2/3).
  const std::vector<float> ref = {0.f, 0.f};
  const std::vector<float> test = {0.f, static_cast<float>(std::log(3.0))};
  const TokenMetrics m = CompareLogits(test.data(), ref.data(), 2, 0);
  EXPECT_NEAR(m.kl, 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  EXPECT_NEAR(m.nll, std::log(4.0), 1e-7);
  EXPECT_NEAR(m.nll_ref, std::log(2.0), 1e-7);
  EXPECT_FALSE(m.top1);  // the reference's tie goes to token 0, the tested picks token 1
}

TEST(EvalMetrics, TotalsAverage) {
  EvalTotals t;
  EXPECT_EQ(t.ppl(), 0);
  t.Add({.nll = 1.0, .nll_ref = 0.5, .kl = 0.2, .top1 = true});
  t.Add({.nll = 3.0, .nll_ref = 1.5, .kl = 0.0, .top1 = false});
  EXPECT_EQ(t.count(), 2);
  EXPECT_NEAR(t.ppl(), std::exp(2.0), 1e-12);
  EXPECT_NEAR(t.ppl_ref(), std::exp(1.0), 1e-12);
  EXPECT_NEAR(t.kl(), 0.1, 1e-12);
  EXPECT_NEAR(t.top1(), 0.5, 1e-12);
}

}  // namespace
}  // namespace sluice::tools
