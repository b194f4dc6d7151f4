// Causal GQA attention on every backend against ref: prefill (many queries from position 0),
// chunked prefill (queries starting mid-sequence), decode (one query), head grouping.
#include "kernels/ref/attention.h"

#include <random>
#include <vector>

#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

using testing::GuardedBuffer;
class AttentionTest : public testing::OpTest<Op::kAttention> {};

TEST_P(AttentionTest, MatchesReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  struct Shape {
    int64_t q_tokens, q_start, extra_kv, heads, kv_heads, head_dim;
  };
  for (const Shape& s :
       {Shape{1, 0, 0, 1, 1, 8}, Shape{17, 0, 0, 9, 3, 64}, Shape{5, 40, 0, 9, 3, 64},
        Shape{1, 300, 0, 8, 2, 128}, Shape{3, 2, 11, 4, 4, 32},
        // More scores than one block holds (2^18): the CPU backend runs the queries in blocks.
        Shape{520, 0, 0, 1, 1, 8}, Shape{20, 14000, 0, 1, 1, 8}}) {
    const int64_t kv_tokens = s.q_start + s.q_tokens + s.extra_kv;
    SCOPED_TRACE(::testing::Message() << "q_tokens=" << s.q_tokens << " q_start=" << s.q_start
                                      << " kv_tokens=" << kv_tokens << " heads=" << s.heads << "/"
                                      << s.kv_heads << " d=" << s.head_dim << " seed=" << seed);
    std::vector<float> q = testing::RandomFloats(rng, s.q_tokens * s.heads * s.head_dim, -2, 2);
    std::vector<float> k = testing::RandomFloats(rng, kv_tokens * s.kv_heads * s.head_dim, -2, 2);
    std::vector<float> v = testing::RandomFloats(rng, kv_tokens * s.kv_heads * s.head_dim, -2, 2);
    std::vector<float> want(q.size());
    AttentionParams p{.q = q.data(),
                      .k = k.data(),
                      .v = v.data(),
                      .out = want.data(),
                      .q_tokens = s.q_tokens,
                      .kv_tokens = kv_tokens,
                      .q_start = s.q_start,
                      .heads = s.heads,
                      .kv_heads = s.kv_heads,
                      .head_dim = s.head_dim,
                      .scale = 1.f / std::sqrt(float(s.head_dim))};
    ref::Attention(p);
    auto qb = GuardedBuffer::Create(*backend_, q.size());
    auto kb = GuardedBuffer::Create(*backend_, k.size());
    auto vb = GuardedBuffer::Create(*backend_, v.size());
    auto ob = GuardedBuffer::Create(*backend_, q.size());
    ASSERT_TRUE(qb.ok() && kb.ok() && vb.ok() && ob.ok());
    ASSERT_TRUE(qb->Upload(q).ok() && kb->Upload(k).ok() && vb->Upload(v).ok());
    p.q = qb->data();
    p.k = kb->data();
    p.v = vb->data();
    p.out = ob->data();
    ASSERT_TRUE(backend_->Attention(p).ok());
    auto got = ob->DownloadChecked();
    ASSERT_TRUE(got.ok()) << got.status();
    testing::ExpectNear(*got, want, {2e-6f}, 2e-5f, "attention");
  }
}

// Cumulative attention per key: a long prompt in one call (several query blocks and key tiles,
// lengths that are not multiples of either), chunked prefill accumulating into the same scores,
// GQA groups. Each query's weights sum to 1, so each head's scores sum to the query count.
TEST_P(AttentionTest, KeyScoresMatchReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  struct Shape {
    int64_t q_tokens, q_start, heads, kv_heads, head_dim;
  };
  for (const Shape& sh : {Shape{300, 0, 9, 3, 64}, Shape{70, 523, 4, 2, 32}, Shape{1, 40, 2, 1, 16},
                          Shape{129, 0, 1, 1, 64}}) {
    const int64_t kv_tokens = sh.q_start + sh.q_tokens;
    SCOPED_TRACE(::testing::Message()
                 << "q_tokens=" << sh.q_tokens << " q_start=" << sh.q_start << " heads=" << sh.heads
                 << "/" << sh.kv_heads << " seed=" << seed);
    std::vector<float> q = testing::RandomFloats(rng, sh.q_tokens * sh.heads * sh.head_dim, -2, 2);
    std::vector<float> k = testing::RandomFloats(rng, kv_tokens * sh.kv_heads * sh.head_dim, -2, 2);
    std::vector<float> v = testing::RandomFloats(rng, kv_tokens * sh.kv_heads * sh.head_dim, -2, 2);
    // Scores start from earlier chunks' values, which the op must add to.
    std::vector<float> prior = testing::RandomFloats(rng, sh.heads * kv_tokens, 0, 3);
    std::vector<float> want(q.size()), want_scores = prior;
    AttentionParams p{.q = q.data(),
                      .k = k.data(),
                      .v = v.data(),
                      .out = want.data(),
                      .q_tokens = sh.q_tokens,
                      .kv_tokens = kv_tokens,
                      .q_start = sh.q_start,
                      .heads = sh.heads,
                      .kv_heads = sh.kv_heads,
                      .head_dim = sh.head_dim,
                      .scale = 1.f / std::sqrt(float(sh.head_dim)),
                      .key_scores = want_scores.data()};
    ref::Attention(p);
    double total = 0;
    for (size_t i = 0; i < want_scores.size(); ++i) total += want_scores[i] - prior[i];
    EXPECT_NEAR(total, double(sh.heads * sh.q_tokens), 1e-3 * sh.heads * sh.q_tokens);
    auto qb = GuardedBuffer::Create(*backend_, q.size());
    auto kb = GuardedBuffer::Create(*backend_, k.size());
    auto vb = GuardedBuffer::Create(*backend_, v.size());
    auto ob = GuardedBuffer::Create(*backend_, q.size());
    auto sb = GuardedBuffer::Create(*backend_, prior.size());
    ASSERT_TRUE(qb.ok() && kb.ok() && vb.ok() && ob.ok() && sb.ok());
    ASSERT_TRUE(qb->Upload(q).ok() && kb->Upload(k).ok() && vb->Upload(v).ok() &&
                sb->Upload(prior).ok());
    p.q = qb->data();
    p.k = kb->data();
    p.v = vb->data();
    p.out = ob->data();
    p.key_scores = sb->data();
    ASSERT_TRUE(backend_->Attention(p).ok());
    auto got = ob->DownloadChecked();
    auto got_scores = sb->DownloadChecked();
    ASSERT_TRUE(got.ok() && got_scores.ok());
    testing::ExpectNear(*got, want, {2e-6f}, 2e-5f, "attention output");
    testing::ExpectNear(*got_scores, want_scores, {2e-5f}, 2e-5f, "key scores");
  }
}

TEST_P(AttentionTest, RejectsQueriesPastTheCache) {
  float buf[64];
  const absl::Status st = backend_->Attention({.q = buf,
                                               .k = buf,
                                               .v = buf,
                                               .out = buf,
                                               .q_tokens = 2,
                                               .kv_tokens = 2,
                                               .q_start = 1,
                                               .heads = 1,
                                               .kv_heads = 1,
                                               .head_dim = 4});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
}

SLUICE_INSTANTIATE_OP_TEST(AttentionTest);

}  // namespace
}  // namespace sluice::kernels
