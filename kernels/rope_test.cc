// RoPE on every backend against ref: both pairings, partial rotary dims, large positions.
#include "kernels/ref/rope.h"

#include <random>
#include <vector>

#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

using testing::GuardedBuffer;
class RopeTest : public testing::OpTest<Op::kRope> {};

TEST_P(RopeTest, MatchesReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  struct Shape {
    int64_t tokens, heads, head_dim, rope_dim;
    bool neox;
    float theta;
  };
  for (const Shape& s : {Shape{1, 1, 2, 2, false, 10000.f}, Shape{5, 9, 64, 64, false, 100000.f},
                         Shape{7, 3, 64, 64, true, 100000.f}, Shape{3, 4, 128, 64, true, 5e5f},
                         Shape{70, 2, 80, 32, false, 10000.f}}) {
    SCOPED_TRACE(::testing::Message()
                 << "tokens=" << s.tokens << " heads=" << s.heads << " head_dim=" << s.head_dim
                 << " rope_dim=" << s.rope_dim << " neox=" << s.neox << " seed=" << seed);
    std::vector<float> x = testing::RandomFloats(rng, s.tokens * s.heads * s.head_dim, -3, 3);
    std::vector<int32_t> pos(s.tokens);
    for (auto& p : pos) p = static_cast<int32_t>(rng() % 8192);
    pos[0] = 0;
    std::vector<float> want = x;
    RopeParams p{.x = want.data(),
                 .positions = pos.data(),
                 .tokens = s.tokens,
                 .heads = s.heads,
                 .head_dim = s.head_dim,
                 .rope_dim = s.rope_dim,
                 .theta_base = s.theta,
                 .neox = s.neox};
    ref::Rope(p);

    auto xb = GuardedBuffer::Create(*backend_, x.size());
    auto pb = backend_->Allocate(pos.size() * 4);
    ASSERT_TRUE(xb.ok() && pb.ok());
    ASSERT_TRUE(xb->Upload(x).ok());
    ASSERT_TRUE(backend_->CopyToDevice(*pb, pos.data(), pos.size() * 4).ok());
    p.x = xb->data();
    p.positions = static_cast<int32_t*>(*pb);
    ASSERT_TRUE(backend_->Rope(p).ok());
    auto got = xb->DownloadChecked();
    backend_->Free(*pb);
    ASSERT_TRUE(got.ok()) << got.status();
    testing::ExpectNear(*got, want, {2e-6f}, 2e-6f, "rope");
  }
}

TEST_P(RopeTest, RejectsOddRopeDim) {
  float x[8];
  int32_t pos[1] = {0};
  EXPECT_EQ(
      backend_
          ->Rope({.x = x, .positions = pos, .tokens = 1, .heads = 1, .head_dim = 8, .rope_dim = 3})
          .code(),
      absl::StatusCode::kInvalidArgument);
}

SLUICE_INSTANTIATE_OP_TEST(RopeTest);

}  // namespace
}  // namespace sluice::kernels
