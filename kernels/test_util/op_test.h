// A parameterized fixture for op tests: one backend per case, skipped with the reason when
// this machine cannot run it or the backend does not support the op yet.
#ifndef SLUICE_KERNELS_TEST_UTIL_OP_TEST_H_
#define SLUICE_KERNELS_TEST_UTIL_OP_TEST_H_

#include <memory>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/test_util/backend_cases.h"

namespace sluice::kernels::testing {

template <Op kOp>
class OpTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    auto backend = CreateForOp(GetParam(), kOp);
    if (!backend.ok()) GTEST_SKIP() << GetParam().name << " skipped: " << backend.status();
    backend_ = std::move(*backend);
  }

  std::unique_ptr<Backend> backend_;
};

#define SLUICE_INSTANTIATE_OP_TEST(Fixture)                                                      \
  INSTANTIATE_TEST_SUITE_P(AllBackends, Fixture,                                                 \
                           ::testing::ValuesIn(::sluice::kernels::testing::BackendsUnderTest()), \
                           [](const auto& info) { return info.param.name; })

}  // namespace sluice::kernels::testing

#endif  // SLUICE_KERNELS_TEST_UTIL_OP_TEST_H_
