// RMSNorm on every backend against the scalar reference: random seeded inputs, ragged shapes,
// in-place operation, guard elements after the output, and invalid parameters.
#include "kernels/ref/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/test_util/backend_cases.h"

namespace sluice::kernels {
namespace {

using testing::BackendCase;
using testing::GuardedBuffer;

class RmsNormTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    auto backend = GetParam().create();
    if (!backend.ok()) GTEST_SKIP() << GetParam().name << " skipped: " << backend.status();
    backend_ = std::move(*backend);
    ASSERT_TRUE(backend_->Supports(Op::kRmsNorm)) << backend_->name();
  }

  // Runs RMSNorm of a [rows, dim] input on the backend and compares with ref.
  void Check(int64_t rows, int64_t dim, bool in_place, uint64_t seed) {
    SCOPED_TRACE(::testing::Message() << backend_->name() << " rows=" << rows << " dim=" << dim
                                      << " in_place=" << in_place << " seed=" << seed);
    std::mt19937_64 rng(seed);
    const float amplitude = std::uniform_real_distribution<float>(0.01f, 50.f)(rng);
    std::vector<float> x = testing::RandomFloats(rng, rows * dim, -amplitude, amplitude);
    std::vector<float> w = testing::RandomFloats(rng, dim, -2.f, 2.f);
    const float eps = 1e-6f;

    std::vector<float> want(rows * dim);
    ref::RmsNorm({.x = x.data(),
                  .weight = w.data(),
                  .y = want.data(),
                  .rows = rows,
                  .dim = dim,
                  .eps = eps});

    auto xbuf = GuardedBuffer::Create(*backend_, x.size());
    auto wbuf = GuardedBuffer::Create(*backend_, w.size());
    auto ybuf = GuardedBuffer::Create(*backend_, x.size());
    ASSERT_TRUE(xbuf.ok() && wbuf.ok() && ybuf.ok());
    ASSERT_TRUE(xbuf->Upload(x).ok());
    ASSERT_TRUE(wbuf->Upload(w).ok());
    float* y = in_place ? xbuf->data() : ybuf->data();
    ASSERT_TRUE(backend_
                    ->RmsNorm({.x = xbuf->data(),
                               .weight = wbuf->data(),
                               .y = y,
                               .rows = rows,
                               .dim = dim,
                               .eps = eps})
                    .ok());
    ASSERT_TRUE(backend_->Synchronize().ok());
    auto got = (in_place ? *xbuf : *ybuf).DownloadChecked();
    ASSERT_TRUE(got.ok()) << got.status();
    auto w_after = wbuf->DownloadChecked();
    ASSERT_TRUE(w_after.ok()) << w_after.status();
    EXPECT_EQ(*w_after, w) << "weight was modified";

    int bad = 0;
    for (size_t i = 0; i < want.size() && bad < 5; ++i) {
      const float tol = 2e-5f * std::max(1.f, std::fabs(want[i]));
      if (!(std::fabs((*got)[i] - want[i]) <= tol)) {
        ADD_FAILURE() << "element " << i << " (row " << i / dim << ", col " << i % dim << "): got "
                      << (*got)[i] << ", want " << want[i];
        ++bad;
      }
    }
  }

  std::unique_ptr<Backend> backend_;
};

TEST_P(RmsNormTest, MatchesReferenceOnRaggedShapes) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const int64_t rows_list[] = {1, 3, 17, 64};
  const int64_t dims[] = {1, 7, 64, 576, 1000, 4097};
  for (int64_t rows : rows_list) {
    for (int64_t dim : dims) Check(rows, dim, /*in_place=*/false, rng());
  }
  // Large enough to take the threaded path on the CPU.
  Check(257, 576, /*in_place=*/false, rng());
}

TEST_P(RmsNormTest, InPlace) {
  const uint64_t seed = testing::TestSeed();
  Check(9, 576, /*in_place=*/true, seed);
  Check(5, 33, /*in_place=*/true, seed + 1);
}

TEST_P(RmsNormTest, RejectsInvalidParameters) {
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 1, 1}, y[4];
  auto code = [&](RmsNormParams p) { return backend_->RmsNorm(p).code(); };
  EXPECT_EQ(code({.x = x, .weight = w, .y = y, .rows = 1, .dim = 0}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.x = x, .weight = w, .y = y, .rows = -1, .dim = 4}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.x = nullptr, .weight = w, .y = y, .rows = 1, .dim = 4}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.x = x, .weight = w, .y = y, .rows = 1, .dim = 4, .eps = -1.f}),
            absl::StatusCode::kInvalidArgument);
  // Zero rows is a no-op, whatever the pointers.
  EXPECT_TRUE(backend_->RmsNorm({.rows = 0, .dim = 4}).ok());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, RmsNormTest,
                         ::testing::ValuesIn(testing::BackendsUnderTest()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::kernels
