// SwiGLU and softmax on every backend against ref.
#include <random>
#include <vector>

#include "kernels/ref/softmax.h"
#include "kernels/ref/swiglu.h"
#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

using testing::GuardedBuffer;
class SwiGluTest : public testing::OpTest<Op::kSwiGlu> {};
class SoftmaxTest : public testing::OpTest<Op::kSoftmax> {};

TEST_P(SwiGluTest, MatchesReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (int64_t n : {1, 15, 1536, 70001}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " seed=" << seed);
    std::vector<float> gate = testing::RandomFloats(rng, n, -20, 20);
    std::vector<float> up = testing::RandomFloats(rng, n, -3, 3);
    std::vector<float> want(n);
    ref::SwiGlu({.gate = gate.data(), .up = up.data(), .out = want.data(), .n = n});
    auto gb = GuardedBuffer::Create(*backend_, n);
    auto ub = GuardedBuffer::Create(*backend_, n);
    ASSERT_TRUE(gb.ok() && ub.ok());
    ASSERT_TRUE(gb->Upload(gate).ok() && ub->Upload(up).ok());
    // In place over gate, as the model runs it.
    ASSERT_TRUE(
        backend_->SwiGlu({.gate = gb->data(), .up = ub->data(), .out = gb->data(), .n = n}).ok());
    auto got = gb->DownloadChecked();
    ASSERT_TRUE(got.ok()) << got.status();
    testing::ExpectNear(*got, want, {1e-6f}, 1e-5f, "swiglu");
  }
}

TEST_P(SoftmaxTest, MatchesReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {2, 49152}, {64, 600}, {5, 33}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " seed=" << seed);
    // The last shape spans far below exp's underflow point.
    const float lo = cols == 33 ? -300.f : -30.f;
    std::vector<float> x = testing::RandomFloats(rng, rows * cols, lo, 30);
    std::vector<float> want = x;
    ref::Softmax({.x = want.data(), .rows = rows, .cols = cols});
    auto xb = GuardedBuffer::Create(*backend_, x.size());
    ASSERT_TRUE(xb.ok());
    ASSERT_TRUE(xb->Upload(x).ok());
    ASSERT_TRUE(backend_->Softmax({.x = xb->data(), .rows = rows, .cols = cols}).ok());
    auto got = xb->DownloadChecked();
    ASSERT_TRUE(got.ok()) << got.status();
    testing::ExpectNear(*got, want, {1e-7f}, 1e-5f, "softmax");
  }
}

SLUICE_INSTANTIATE_OP_TEST(SwiGluTest);
SLUICE_INSTANTIATE_OP_TEST(SoftmaxTest);

}  // namespace
}  // namespace sluice::kernels
