// Backend::CopyOnDevice on every backend: copies land where they are asked to, in order with the
// backend's ops, and nothing outside them changes.
#include <cstring>
#include <random>
#include <vector>

#include "kernels/test_util/backend_cases.h"
#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

class CopyOnDeviceTest : public ::testing::TestWithParam<testing::BackendCase> {
 protected:
  void SetUp() override {
    auto backend = GetParam().create();
    if (!backend.ok()) GTEST_SKIP() << GetParam().name << " skipped: " << backend.status();
    backend_ = std::move(*backend);
  }
  std::unique_ptr<Backend> backend_;
};

TEST_P(CopyOnDeviceTest, CopiesRangesAndLeavesTheRest) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const size_t n = 4096;
  std::vector<uint8_t> a(n), b(n);
  for (auto& x : a) x = static_cast<uint8_t>(rng());
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  auto da = backend_->Allocate(n);
  auto db = backend_->Allocate(n);
  ASSERT_TRUE(da.ok() && db.ok());
  uint8_t* pa = static_cast<uint8_t*>(*da);
  uint8_t* pb = static_cast<uint8_t*>(*db);
  ASSERT_TRUE(backend_->CopyToDevice(pa, a.data(), n).ok());
  ASSERT_TRUE(backend_->CopyToDevice(pb, b.data(), n).ok());
  // Random disjoint ranges of a go to random disjoint ranges of b, and one within a.
  std::vector<Backend::Copy> copies;
  std::vector<uint8_t> want = b, want_a = a;
  for (size_t at = 0; at + 300 < n / 2; at += 300) {
    const size_t bytes = 1 + rng() % 200, from = rng() % (n - bytes);
    copies.push_back({.dst = pb + at, .src = pa + from, .bytes = bytes});
    std::memcpy(&want[at], &a[from], bytes);
  }
  copies.push_back({.dst = pa + n / 2, .src = pa, .bytes = 100});
  std::memcpy(&want_a[n / 2], &a[0], 100);
  copies.push_back({.dst = pb, .src = pa, .bytes = 0});
  ASSERT_TRUE(backend_->CopyOnDevice(copies).ok());
  std::vector<uint8_t> got(n), got_a(n);
  ASSERT_TRUE(backend_->CopyToHost(got.data(), pb, n).ok());
  ASSERT_TRUE(backend_->CopyToHost(got_a.data(), pa, n).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_a, want_a);
  backend_->Free(pa);
  backend_->Free(pb);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, CopyOnDeviceTest,
                         ::testing::ValuesIn(testing::BackendsUnderTest()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::kernels
