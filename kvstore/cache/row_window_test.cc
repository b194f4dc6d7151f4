// RowWindow: rows survive growth, drops and clones, and a window that keeps dropping its oldest
// rows (a decode's flushes) holds little more than it needs.
#include "kvstore/cache/row_window.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/host_backend.h"
#include "kernels/ref/ref_backend.h"

namespace sluice::kvstore {
namespace {

constexpr int64_t kRow = 3;

// Writes row values first, first + 1, ... into rows [from, to) of the window.
void Fill(kernels::Backend& backend, RowWindow& w, int64_t from, int64_t to, float first) {
  std::vector<float> x((to - from) * kRow);
  for (size_t i = 0; i < x.size(); ++i) x[i] = first + static_cast<float>(i / kRow);
  ASSERT_TRUE(backend.CopyToDevice(w.data() + from * kRow, x.data(), x.size() * 4).ok());
}

std::vector<float> FirstColumn(kernels::Backend& backend, const RowWindow& w) {
  std::vector<float> x(w.rows() * kRow), first(w.rows());
  if (!x.empty()) EXPECT_TRUE(backend.CopyToHost(x.data(), w.data(), x.size() * 4).ok());
  for (int64_t r = 0; r < w.rows(); ++r) first[r] = x[r * kRow];
  return first;
}

TEST(RowWindow, KeepsRowsThroughGrowthDropsAndClones) {
  kernels::RefBackend backend;
  RowWindow w(kRow);
  EXPECT_EQ(w.data(), nullptr);
  ASSERT_TRUE(w.Resize(backend, 5).ok());
  Fill(backend, w, 0, 5, 0.f);
  w.DropFront(2);
  ASSERT_TRUE(w.Resize(backend, 40).ok());  // grows: the 3 live rows move
  Fill(backend, w, 3, 40, 5.f);
  std::vector<float> want = {2, 3, 4};
  for (int i = 5; i < 42; ++i) want.push_back(static_cast<float>(i));
  EXPECT_EQ(FirstColumn(backend, w), want);
  auto copy = w.Clone(backend);
  ASSERT_TRUE(copy.ok());
  Fill(backend, w, 0, 1, -1.f);  // the clone has memory of its own
  EXPECT_EQ(FirstColumn(backend, *copy), want);
  EXPECT_EQ(copy->capacity(), copy->rows());    // and no headroom: a cached prefix keeps it as is
  ASSERT_TRUE(copy->Resize(backend, 41).ok());  // one that goes on writing grows
  Fill(backend, *copy, 40, 41, 99.f);
  want.push_back(99.f);
  EXPECT_EQ(FirstColumn(backend, *copy), want);
  ASSERT_TRUE(w.Resize(backend, 2).ok());  // shrinking drops the newest
  EXPECT_EQ(FirstColumn(backend, w), (std::vector<float>{-1, 3}));
}

// Host memory that counts its allocations.
class CountingBackend final : public kernels::HostBackend {
 public:
  kernels::BackendKind kind() const override { return kernels::BackendKind::kRef; }
  std::string name() const override { return "counting"; }
  bool Supports(kernels::Op) const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    ++allocations;
    return HostBackend::Allocate(bytes);
  }
  int allocations = 0;
};

TEST(RowWindow, ADecodeHoldsLittleMoreThanItsRows) {
  CountingBackend backend;
  int allocations_at_1000 = 0;
  RowWindow w(kRow);
  ASSERT_TRUE(w.Resize(backend, 512).ok());  // a prompt
  w.DropFront(480);
  float next = 0;
  for (int step = 0; step < 10000; ++step) {
    ASSERT_TRUE(w.Resize(backend, w.rows() + 1).ok());
    Fill(backend, w, w.rows() - 1, w.rows(), next++);
    if (w.rows() == 64) w.DropFront(32);  // a flush of one token group
    if (step > 1000) {
      ASSERT_LE(w.capacity(), 64 + 64) << "step " << step;  // its rows and 64 of headroom
    }
    if (step == 1000) allocations_at_1000 = backend.allocations;
  }
  // Once its buffer fits, a decode's rows move to its front: no step allocates.
  EXPECT_EQ(backend.allocations, allocations_at_1000);
  const std::vector<float> first = FirstColumn(backend, w);
  for (size_t r = 0; r < first.size(); ++r) EXPECT_EQ(first[r], next - first.size() + r);
}

}  // namespace
}  // namespace sluice::kvstore
