// Backend::CopyOnDevice on every backend: copies land where they are asked to, in order with the
// backend's ops, and nothing outside them changes.
#include <array>
#include <cstring>
#include <random>
#include <utility>
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
  // Two buffers of n random bytes on the backend, a's and b's host copies beside them; TearDown
  // frees them.
  void MakeBuffers(size_t n, std::mt19937_64& rng, std::vector<uint8_t>* a, std::vector<uint8_t>* b,
                   uint8_t** pa, uint8_t** pb) {
    a->resize(n);
    b->resize(n);
    for (auto& x : *a) x = static_cast<uint8_t>(rng());
    for (auto& x : *b) x = static_cast<uint8_t>(rng());
    for (auto [host, device] : {std::pair{a, pa}, std::pair{b, pb}}) {
      auto d = backend_->Allocate(n);
      ASSERT_TRUE(d.ok()) << d.status();
      *device = static_cast<uint8_t*>(*d);
      owned_.push_back(*device);
      ASSERT_TRUE(backend_->CopyToDevice(*device, host->data(), n).ok());
    }
  }
  void TearDown() override {
    for (void* p : owned_) backend_->Free(p);
  }

  std::unique_ptr<Backend> backend_;
  std::vector<void*> owned_;
};

TEST_P(CopyOnDeviceTest, CopiesRangesAndLeavesTheRest) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const size_t n = 4096;
  std::vector<uint8_t> a, b;
  uint8_t *pa = nullptr, *pb = nullptr;
  ASSERT_NO_FATAL_FAILURE(MakeBuffers(n, rng, &a, &b, &pa, &pb));
  // Random ranges of a's first half go to random disjoint ranges of b, and one within a, to its
  // second half (a call's copies run in any order, so none reads what another writes).
  std::vector<Backend::Copy> copies;
  std::vector<uint8_t> want = b, want_a = a;
  for (size_t at = 0; at + 300 < n / 2; at += 300) {
    const size_t bytes = 1 + rng() % 200, from = rng() % (n / 2 - bytes);
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
}

// More copies than one device launch takes (the CUDA backend batches them 128 at a time), of
// every alignment (16-byte, 4-byte and odd ends and lengths) and sizes from one byte to ranges
// that several blocks share.
TEST_P(CopyOnDeviceTest, ManyCopiesOfEveryAlignmentAndSize) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const size_t n = size_t{4} << 20;
  std::vector<uint8_t> a, b;
  uint8_t *pa = nullptr, *pb = nullptr;
  ASSERT_NO_FATAL_FAILURE(MakeBuffers(n, rng, &a, &b, &pa, &pb));
  std::vector<Backend::Copy> copies;
  std::vector<uint8_t> want = b;
  size_t at = 0;
  for (int i = 0; i < 300; ++i) {
    const size_t align = std::array<size_t, 3>{16, 4, 1}[i % 3];
    size_t bytes = i % 50 == 7 ? 40000 + rng() % 90000 : 1 + rng() % 3000;
    if (i % 6 < 3) bytes = (bytes + align - 1) / align * align;  // lengths of whole elements too
    at = (at + align - 1) / align * align;
    if (at + bytes > n) break;
    const size_t from = (rng() % (n - bytes)) / align * align;
    copies.push_back({.dst = pb + at, .src = pa + from, .bytes = bytes});
    std::memcpy(&want[at], &a[from], bytes);
    at += bytes + rng() % 64;
  }
  ASSERT_GT(copies.size(), 256u);
  ASSERT_TRUE(backend_->CopyOnDevice(copies).ok());
  std::vector<uint8_t> got(n);
  ASSERT_TRUE(backend_->CopyToHost(got.data(), pb, n).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], want[i]) << "byte " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, CopyOnDeviceTest,
                         ::testing::ValuesIn(testing::BackendsUnderTest()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::kernels
