#include "model/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::model {
namespace {

std::vector<float> LogProbs(std::vector<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

TEST(Sampler, GreedyPicksTheArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 3.f, -2.f, 3.f}, {}), 1);
}

TEST(Sampler, TemperatureOneFollowsTheDistribution) {
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 1234;
  Sampler s(p);
  const std::vector<float> logits = LogProbs({0.5, 0.3, 0.15, 0.05});
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[s.Sample(logits, {})];
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.015);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.015);
  EXPECT_NEAR(counts[2] / double(n), 0.15, 0.015);
  EXPECT_NEAR(counts[3] / double(n), 0.05, 0.01);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.seed = 99;
  const std::vector<float> logits = LogProbs({0.25, 0.25, 0.25, 0.25});
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(logits, {}), b.Sample(logits, {}));
}

TEST(Sampler, SkipGoesOnWhereAnotherSamplerStopped) {
  SamplingParams p;
  p.seed = 7;
  p.top_k = 3;
  const std::vector<float> logits = LogProbs({0.2, 0.2, 0.2, 0.2, 0.2});
  Sampler whole(p), first(p), rest(p);
  std::vector<int32_t> want, got;
  for (int i = 0; i < 40; ++i) want.push_back(whole.Sample(logits, {}));
  for (int i = 0; i < 5; ++i) got.push_back(first.Sample(logits, {}));
  rest.Skip(5);
  for (int i = 5; i < 40; ++i) got.push_back(rest.Sample(logits, {}));
  EXPECT_EQ(got, want);
}

TEST(Sampler, FiltersKeepOnlyWhatTheyShould) {
  const std::vector<float> logits = LogProbs({0.4, 0.3, 0.2, 0.1});
  auto support = [&](SamplingParams p) {
    p.seed = 7;
    Sampler s(p);
    std::map<int, int> seen;
    for (int i = 0; i < 4000; ++i) ++seen[s.Sample(logits, {})];
    std::vector<int> ids;
    for (auto& [id, c] : seen) ids.push_back(id);
    return ids;
  };
  SamplingParams k2;
  k2.top_k = 2;
  EXPECT_EQ(support(k2), (std::vector<int>{0, 1}));
  SamplingParams p65;
  p65.top_p = 0.65f;  // 0.4 + 0.3 reaches it
  EXPECT_EQ(support(p65), (std::vector<int>{0, 1}));
  SamplingParams minp;
  minp.min_p = 0.5f;  // keep p >= 0.2
  EXPECT_EQ(support(minp), (std::vector<int>{0, 1, 2}));
  SamplingParams all;
  EXPECT_EQ(support(all), (std::vector<int>{0, 1, 2, 3}));
}

TEST(Sampler, RepetitionPenaltyDemotesSeenTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.f;
  Sampler s(p);
  // Token 0 (logit 2) halves to 1 < 1.5; a negative logit would be doubled instead.
  EXPECT_EQ(s.Sample(std::vector<float>{2.f, 1.5f, -1.f}, std::vector<int32_t>{0, 0}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{-1.f, -1.5f}, std::vector<int32_t>{0}), 1);
}

TEST(SamplingParams, ValidateNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(p.Validate().message().find("top_p"), absl::string_view::npos);
  p = {};
  p.temperature = -1;
  EXPECT_NE(p.Validate().message().find("temperature"), absl::string_view::npos);
  p = {};
  p.stop_strings = {""};
  EXPECT_FALSE(p.Validate().ok());
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
}

TEST(StopChecker, TokensStringsAndLength) {
  SamplingParams p;
  p.max_tokens = 5;
  p.stop_tokens = {2};
  p.stop_strings = {"\n\n", "END"};
  StopChecker c(p);
  size_t end;
  EXPECT_EQ(c.Check(2, 1, "hi", &end), StopChecker::Reason::kStopToken);
  EXPECT_EQ(c.Check(7, 1, "hi", &end), StopChecker::Reason::kNone);
  EXPECT_EQ(c.Check(7, 2, "one\n\ntwo", &end), StopChecker::Reason::kStopString);
  EXPECT_EQ(end, 3u);
  EXPECT_EQ(c.Check(7, 5, "text", &end), StopChecker::Reason::kMaxTokens);
  EXPECT_EQ(c.HoldBack("abc\n"), 1u);
  EXPECT_EQ(c.HoldBack("xxEN"), 2u);
  EXPECT_EQ(c.HoldBack("xyz"), 0u);
}

}  // namespace
}  // namespace sluice::model
