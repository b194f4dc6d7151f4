#include "kvstore/policy/token_policy.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/ref/ref_backend.h"
#include "kvstore/policy/leankv.h"

namespace sluice::kvstore::policy {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A sequence as a policy sees it: each list's live tokens per tier (one page each), with
// every eviction and demotion recorded and carried out.
class FakeSequence final : public SequenceView {
 public:
  FakeSequence(int64_t lists, int64_t length, int64_t compressed)
      : length_(length), compressed_(compressed), lists_(lists), live_(lists) {}

  int64_t length() const override { return length_; }
  int64_t compressed() const override { return compressed_; }
  SequenceState& state() override { return state_; }
  ListState& list(int64_t i) override { return lists_[i]; }
  int64_t lists() const override { return static_cast<int64_t>(lists_.size()); }
  void ForEachLive(int64_t i, int tier,
                   absl::FunctionRef<void(const LiveToken&)> fn) const override {
    int32_t slot = 0;
    for (int64_t p : live_[i][tier]) fn({.position = p, .page = 0, .slot = slot++});
  }
  absl::Status Evict(int64_t i, absl::Span<const int64_t> positions) override {
    for (int64_t p : positions) {
      if (p < 0 || p >= length_) return absl::InvalidArgumentError("position out of range");
      evicted[i].insert(p);
      for (auto& tier : live_[i]) std::erase(tier, p);
    }
    return absl::OkStatus();
  }
  absl::Status Demote(int64_t i, const LiveToken& token) override {
    demoted[i].insert(token.position);
    std::erase(live_[i][0], token.position);
    live_[i][1].push_back(token.position);
    return absl::OkStatus();
  }

  void SetLive(int64_t i, int tier, std::vector<int64_t> positions) {
    live_[i][tier] = std::move(positions);
  }
  void set_length(int64_t n) { length_ = n; }

  std::map<int64_t, std::set<int64_t>> evicted, demoted;

 private:
  int64_t length_, compressed_;
  SequenceState state_;
  std::vector<ListState> lists_;
  std::vector<std::array<std::vector<int64_t>, 2>> live_;
};

constexpr PolicyShape kShape{
    .layers = 4, .heads = 4, .kv_heads = 2, .head_dim = 16, .scale = 0.25f};

std::unique_ptr<TokenPolicy> Make(KvPolicy config, PolicyShape shape = kShape) {
  auto p = MakeTokenPolicy(config, shape);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

TEST(TokenPolicyTest, EveryKindHasItsObject) {
  struct Want {
    KvPolicyKind kind;
    std::string_view name;
    ScoreMode scores;
    bool selects_prompt, two_tiers, changes_pages;
  };
  for (const Want& w : std::vector<Want>{
           {KvPolicyKind::kNone, "none", ScoreMode::kNone, false, false, false},
           {KvPolicyKind::kSinks, "sinks", ScoreMode::kNone, false, false, true},
           {KvPolicyKind::kSnapKv, "snapkv", ScoreMode::kNone, true, false, true},
           {KvPolicyKind::kPyramid, "pyramid", ScoreMode::kNone, true, false, true},
           {KvPolicyKind::kMiniKv, "minikv", ScoreMode::kNone, true, false, true},
           {KvPolicyKind::kH2o, "h2o", ScoreMode::kSummed, false, false, true},
           {KvPolicyKind::kLeanKv, "leankv", ScoreMode::kPerQueryHead, false, true, true}}) {
    auto p = Make({.kind = w.kind, .budget = 0.5f});
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->name(), w.name);
    EXPECT_EQ(p->scores(), w.scores) << w.name;
    EXPECT_EQ(p->selects_prompt(), w.selects_prompt) << w.name;
    EXPECT_EQ(p->two_tiers(), w.two_tiers) << w.name;
    EXPECT_EQ(p->changes_pages(), w.changes_pages) << w.name;
  }
}

TEST(TokenPolicyTest, RejectsBadSettingsAndShapes) {
  EXPECT_EQ(MakeTokenPolicy({.kind = KvPolicyKind::kSinks, .budget = 0.f}, kShape).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeTokenPolicy({.kind = KvPolicyKind::kSnapKv, .pool = 4}, kShape).status().code(),
            absl::StatusCode::kInvalidArgument);
  PolicyShape bad = kShape;
  bad.kv_heads = 3;
  const absl::Status st = MakeTokenPolicy({}, bad).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("kv_heads=3"));
}

TEST(SinksPolicyTest, EvictsWhatFallsOutOfTheBudgetOnce) {
  auto p = Make({.kind = KvPolicyKind::kSinks, .budget = 0.25f, .sinks = 4});
  FakeSequence seq(/*lists=*/3, /*length=*/20, /*compressed=*/16);
  ASSERT_TRUE(p->AfterCommit(seq, 20, {}).ok());
  // keep = max(5, ceil(5)) = 5: the 4 sinks and position 19.
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(seq.evicted[i].size(), 15u);
    EXPECT_EQ(*seq.evicted[i].begin(), 4);
    EXPECT_EQ(*seq.evicted[i].rbegin(), 18);
  }
  EXPECT_EQ(seq.state().evicted_to, 19);
  seq.evicted.clear();
  seq.set_length(21);  // keep = 6: nothing new falls out
  ASSERT_TRUE(p->AfterCommit(seq, 1, {}).ok());
  EXPECT_THAT(seq.evicted, IsEmpty());
  seq.set_length(24);  // keep = 6: the 4 sinks, 22 and 23
  ASSERT_TRUE(p->AfterCommit(seq, 1, {}).ok());
  EXPECT_THAT(seq.evicted[0], ElementsAre(19, 20, 21));
}

TEST(H2oPolicyTest, KeepsTheRecentHalfAndTheHeaviestHitters) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(0.f, 1.f);
  auto p = Make({.kind = KvPolicyKind::kH2o, .budget = 0.25f});
  const int64_t length = 40;
  FakeSequence seq(2, length, 32);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t t = 0; t < length; ++t) seq.list(i).score.push_back(u(rng));
  }
  ASSERT_TRUE(p->AfterCommit(seq, length, {}).ok());
  // keep 10: the 5 most recent and the 5 heaviest of positions 0..34.
  for (int64_t i = 0; i < 2; ++i) {
    const std::vector<float>& score = seq.list(i).score;
    std::vector<int64_t> order(35);
    for (int64_t t = 0; t < 35; ++t) order[t] = t;
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    const std::set<int64_t> want(order.begin() + 5, order.end());
    EXPECT_EQ(seq.evicted[i], want);
    for (int64_t t = 0; t < length; ++t) EXPECT_EQ(seq.list(i).gone[t] != 0, want.contains(t));
  }
}

// Attention of queries [n - scorers, n) over causal keys, each key's weight summed over the
// queries of each head: [heads][n].
std::vector<double> KeyScores(const std::vector<float>& q, const std::vector<float>& k, int64_t n,
                              int64_t scorers) {
  const PolicyShape& sh = kShape;
  std::vector<double> scores(sh.heads * n, 0.0);
  for (int64_t h = 0; h < sh.heads; ++h) {
    const int64_t kh = h / sh.group();
    for (int64_t qp = n - scorers; qp < n; ++qp) {
      std::vector<double> logit(qp + 1);
      double top = -1e300, sum = 0;
      for (int64_t j = 0; j <= qp; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < sh.head_dim; ++c) {
          dot += double{q[(qp * sh.heads + h) * sh.head_dim + c]} *
                 k[(j * sh.kv_heads + kh) * sh.head_dim + c];
        }
        logit[j] = dot * sh.scale;
        top = std::max(top, logit[j]);
      }
      for (double& l : logit) sum += (l = std::exp(l - top));
      for (int64_t j = 0; j <= qp; ++j) scores[h * n + j] += logit[j] / sum;
    }
  }
  return scores;
}

// The prompt positions a SnapKV-style selection drops, computed from scratch.
std::set<int64_t> ExpectedDrops(const std::vector<double>& scores, int64_t n, int64_t kv_head,
                                float budget, int64_t window, bool normalized, int radius) {
  const int64_t keep = static_cast<int64_t>(std::ceil(budget * n));
  if (keep >= n) return {};
  const int64_t candidates = n - window, pick = std::max<int64_t>(0, keep - window);
  std::vector<double> summed(candidates), pooled(candidates);
  for (int64_t j = 0; j < candidates; ++j) {
    for (int64_t g = 0; g < kShape.group(); ++g) {
      summed[j] += scores[(kv_head * kShape.group() + g) * n + j];
    }
    if (normalized) summed[j] /= static_cast<double>(n - j);
  }
  for (int64_t j = 0; j < candidates; ++j) {
    pooled[j] = summed[j];
    for (int64_t o = std::max<int64_t>(0, j - radius); o <= std::min(candidates - 1, j + radius);
         ++o) {
      pooled[j] = std::max(pooled[j], summed[o]);
    }
  }
  std::vector<int64_t> order(candidates);
  for (int64_t j = 0; j < candidates; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return pooled[a] > pooled[b]; });
  return {order.begin() + std::min(pick, candidates), order.end()};
}

TEST(SnapKvPolicyTest, SelectionsMatchAScalarOracle) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 1.f);
  kernels::RefBackend backend;
  const int64_t n = 96;
  std::vector<float> q(n * kShape.heads * kShape.head_dim),
      k(n * kShape.kv_heads * kShape.head_dim), v(k.size());
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (KvPolicyKind kind : {KvPolicyKind::kSnapKv, KvPolicyKind::kPyramid, KvPolicyKind::kMiniKv}) {
    const KvPolicy config{.kind = kind, .budget = 0.5f, .observation = 16, .pool = 5};
    auto p = Make(config);
    const bool minikv = kind == KvPolicyKind::kMiniKv;
    const std::vector<double> scores = KeyScores(q, k, n, minikv ? n : 16);
    for (int layer = 0; layer < kShape.layers; ++layer) {
      auto drops = p->SelectPrompt(
          backend, {.layer = layer, .q = q.data(), .k = k.data(), .v = v.data(), .n = n});
      ASSERT_TRUE(drops.ok()) << drops.status();
      ASSERT_EQ(drops->size(), 2u);
      const float budget =
          kind == KvPolicyKind::kSnapKv ? 0.5f : PyramidBudget(config, layer, kShape.layers);
      for (int64_t h = 0; h < kShape.kv_heads; ++h) {
        const std::set<int64_t> got((*drops)[h].begin(), (*drops)[h].end());
        EXPECT_EQ(got, ExpectedDrops(scores, n, h, budget, 16, minikv, 2))
            << p->name() << " layer " << layer << " kv-head " << h;
        EXPECT_EQ(static_cast<int64_t>(got.size()),
                  n - std::max<int64_t>(16, std::ceil(budget * n)));
      }
    }
  }
}

TEST(LeanKvPolicyTest, PlacesTokensByTheirSignificance) {
  auto p = Make({.kind = KvPolicyKind::kLeanKv, .alpha_high = 1.f, .alpha_low = 0.25f});
  // length 10: high from 0.1, low from 0.025 significance. Group 2: max over two heads,
  // divided by the 10 - position queries that saw it.
  FakeSequence seq(1, 10, 4);
  std::vector<float>& score = seq.list(0).score;
  score.assign(20, 0.f);
  score[4 * 2 + 1] = 0.6f * 6;   // position 4: 0.6  -> high
  score[5 * 2 + 0] = 0.05f * 5;  // position 5: 0.05 -> low
  score[6 * 2 + 1] = 0.01f * 4;  // position 6: 0.01 -> evicted
  score[7 * 2 + 0] = 0.1f * 3;   // position 7: exactly alpha_high / N -> high
  const TierChoice choice = p->ChooseTiers(seq, 4);
  ASSERT_EQ(choice.size(), 1u);
  EXPECT_THAT(choice[0], ElementsAre(0, 1, -1, 0));
}

TEST(LeanKvPolicyTest, EachStepTheJoinedTierGivesUpItsLeastSignificant) {
  auto p = Make({.kind = KvPolicyKind::kLeanKv, .alpha_high = 1.f, .alpha_low = 0.25f});
  FakeSequence seq(2, 10, 9);
  for (int64_t i = 0; i < 2; ++i) {
    std::vector<float>& score = seq.list(i).score;
    score.assign(20, 1.f);  // everything significant...
  }
  seq.list(0).score[2 * 2] = 0.05f * 8;  // ...but position 2 of list 0: demoted
  seq.list(0).score[2 * 2 + 1] = 0.f;
  seq.list(1).score[3 * 2] = 0.001f * 7;  // and position 3 of list 1: evicted
  seq.list(1).score[3 * 2 + 1] = 0.f;
  seq.list(1).score[5 * 2] = seq.list(1).score[5 * 2 + 1] = 0.f;  // low-tier 5: evicted
  seq.SetLive(0, 0, {0, 1, 2, 3, 8});
  seq.SetLive(1, 0, {0, 1, 3, 8});
  seq.SetLive(1, 1, {5});
  // The prompt's commit runs no Algorithm 1.
  ASSERT_TRUE(p->AfterCommit(seq, 10, {{0}, {0}}).ok());
  EXPECT_THAT(seq.evicted, IsEmpty());
  ASSERT_TRUE(p->AfterCommit(seq, 1, {{0}, {0}}).ok());
  EXPECT_THAT(seq.demoted[0], ElementsAre(2));
  EXPECT_THAT(seq.evicted[1], ElementsAre(3));
  ASSERT_TRUE(p->AfterCommit(seq, 1, {{-1}, {1}}).ok());  // list 1's token joined the low tier
  EXPECT_THAT(seq.evicted[1], ElementsAre(3, 5));
  EXPECT_THAT(seq.demoted[0], ElementsAre(2));
}

}  // namespace
}  // namespace sluice::kvstore::policy
