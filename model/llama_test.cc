// The Llama forward on tiny random models: prefill equals token-by-token decode, batched decode
// equals per-sequence runs, ref and cpu backends agree, bad input is rejected, and the KV cache
// frees what it holds. The real model is checked against HF goldens in llama_golden_test.
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/ref_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "model/test_util/gguf_writer.h"
#include "model/test_util/tiny_cache.h"
#include "model/test_util/tiny_llama.h"

namespace sluice::model {
namespace {

using kernels::GgmlType;

std::unique_ptr<kvstore::PagedKvCache> MakeCache(const testing::TinyLlamaSpec& spec,
                                                 kernels::Backend& backend,
                                                 std::string_view preset = "fp16",
                                                 int32_t residual = 1024) {
  auto cache = testing::MakeTinyCache(spec, backend, preset, residual);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

struct Loaded {
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<LlamaModel> model;
};

Loaded Load(const testing::TinyLlamaSpec& spec, kernels::Backend& backend, uint64_t seed) {
  Loaded l;
  auto g = GgufFile::FromBytes(testing::BuildTinyLlamaGguf(spec, seed));
  EXPECT_TRUE(g.ok()) << g.status();
  l.gguf = std::move(*g);
  auto m = LlamaModel::Load(*l.gguf, backend);
  EXPECT_TRUE(m.ok()) << m.status();
  l.model = std::move(*m);
  return l;
}

float MaxRelError(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return worst / std::max(scale, 1e-20f);
}

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

class LlamaTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    spec_.weight_type = GetParam();
    cpu_ = *kernels::CpuBackend::Create();
    seed_ = std::random_device{}();
  }
  testing::TinyLlamaSpec spec_;
  std::unique_ptr<kernels::CpuBackend> cpu_;
  uint64_t seed_;
};

TEST_P(LlamaTest, PrefillEqualsIncrementalDecode) {
  SCOPED_TRACE(seed_);
  Loaded l = Load(spec_, *cpu_, seed_);
  std::mt19937_64 rng(seed_);
  const std::vector<int32_t> tokens = RandomTokens(rng, 23, spec_.vocab);
  const int64_t vocab = l.model->config().vocab;
  auto cache_owner = MakeCache(spec_, *cpu_);
  kvstore::PagedKvCache& cache = *cache_owner;

  ASSERT_TRUE(cache.AddSequence(1, 64).ok());
  std::vector<float> prefill(vocab);
  ASSERT_TRUE(l.model->Forward({{1, tokens}}, cache, prefill.data()).ok());
  EXPECT_EQ(*cache.Length(1), 23);

  ASSERT_TRUE(cache.AddSequence(2, 64).ok());
  std::vector<float> step(vocab);
  // A chunk of 10, then one token at a time.
  ASSERT_TRUE(
      l.model->Forward({{2, absl::MakeSpan(tokens).subspan(0, 10)}}, cache, step.data()).ok());
  for (size_t i = 10; i < tokens.size(); ++i) {
    ASSERT_TRUE(
        l.model->Forward({{2, absl::MakeSpan(tokens).subspan(i, 1)}}, cache, step.data()).ok());
  }
  EXPECT_LT(MaxRelError(step, prefill), 1e-5);
  for (float v : prefill) ASSERT_TRUE(std::isfinite(v));
}

// With tokens moving into compressed pages as they go, incremental decoding stays close to the
// all-fp32 prefill: fp16 pages within fp16 rounding, 4-bit KIVI pages within a coarser bound;
// and every page returns to the pool when the sequence ends.
TEST_P(LlamaTest, CompressedPagesStayCloseToFullPrecision) {
  SCOPED_TRACE(seed_);
  Loaded l = Load(spec_, *cpu_, seed_);
  std::mt19937_64 rng(seed_ + 3);
  const std::vector<int32_t> tokens = RandomTokens(rng, 100, spec_.vocab);
  const int64_t vocab = l.model->config().vocab;
  auto exact = MakeCache(spec_, *cpu_);
  ASSERT_TRUE(exact->AddSequence(0, 128).ok());
  std::vector<float> want(vocab);
  ASSERT_TRUE(l.model->Forward({{0, tokens}}, *exact, want.data()).ok());
  for (auto [preset, residual, tol] :
       {std::tuple{"fp16", 0, 5e-3}, std::tuple{"int8", 0, 3e-2}, std::tuple{"kivi4", 8, 0.15}}) {
    SCOPED_TRACE(preset);
    auto cache = MakeCache(spec_, *cpu_, preset, residual);
    ASSERT_TRUE(cache->AddSequence(0, 128).ok());
    std::vector<float> got(vocab);
    ASSERT_TRUE(
        l.model->Forward({{0, absl::MakeSpan(tokens).subspan(0, 40)}}, *cache, got.data()).ok());
    for (size_t i = 40; i < tokens.size(); ++i) {
      ASSERT_TRUE(
          l.model->Forward({{0, absl::MakeSpan(tokens).subspan(i, 1)}}, *cache, got.data()).ok());
    }
    EXPECT_GT(cache->pool().used_pages(), 0);
    EXPECT_LT(MaxRelError(got, want), tol);
    ASSERT_TRUE(cache->RemoveSequence(0).ok());
    EXPECT_EQ(cache->pool().used_pages(), 0);
  }
}

TEST_P(LlamaTest, BatchedDecodeEqualsSeparateRuns) {
  SCOPED_TRACE(seed_);
  Loaded l = Load(spec_, *cpu_, seed_);
  std::mt19937_64 rng(seed_ + 1);
  const int64_t vocab = l.model->config().vocab;
  auto cache_owner = MakeCache(spec_, *cpu_);
  kvstore::PagedKvCache& cache = *cache_owner;
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < 3; ++s) prompts.push_back(RandomTokens(rng, 3 + 5 * s, spec_.vocab));

  // Separately.
  std::vector<std::vector<float>> alone(3, std::vector<float>(vocab));
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(cache.AddSequence(s, 64).ok());
    ASSERT_TRUE(l.model->Forward({{s, prompts[s]}}, cache, alone[s].data()).ok());
  }
  // Together, with different lengths, in sequences 10..12.
  std::vector<ForwardEntry> batch;
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(cache.AddSequence(10 + s, 64).ok());
    batch.push_back({10 + s, prompts[s]});
  }
  std::vector<float> together(3 * vocab);
  ASSERT_TRUE(l.model->Forward(batch, cache, together.data()).ok());
  for (int s = 0; s < 3; ++s) {
    std::vector<float> row(together.begin() + s * vocab, together.begin() + (s + 1) * vocab);
    EXPECT_LT(MaxRelError(row, alone[s]), 1e-5) << "sequence " << s;
  }
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(cache.RemoveSequence(s).ok());
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(cache.RemoveSequence(10 + s).ok());
  EXPECT_EQ(cache.Stats().sequences, 0);
  EXPECT_EQ(cache.pool().used_pages(), 0);
}

// Where two logit rows first differ, or -1: batching must not change a bit.
int64_t FirstDifference(absl::Span<const float> a, absl::Span<const float> b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// A sequence's logits are the same bits whatever its pass holds (kernels::MatmulRows, the
// attention's per-sequence split): prompts prefilled alone or together, then decode steps run
// alone or in batches of changing size and order beside other sequences, over pages that
// compress (kivi4) and pages that do not (fp16).
TEST_P(LlamaTest, ASequenceIsTheSameBitsInAnyBatch) {
  SCOPED_TRACE(seed_);
  Loaded l = Load(spec_, *cpu_, seed_);
  const int64_t vocab = l.model->config().vocab;
  for (auto [preset, residual] : {std::pair{"fp16", 0}, std::pair{"kivi4", 8}}) {
    SCOPED_TRACE(preset);
    std::mt19937_64 rng(seed_ + 4);
    auto made = testing::MakeTinyCache(spec_, *cpu_, preset, residual, /*pages=*/2048);
    ASSERT_TRUE(made.ok()) << made.status();
    std::unique_ptr<kvstore::PagedKvCache> cache = std::move(*made);
    std::vector<std::vector<int32_t>> prompts;
    for (int n : {3, 150, 700}) prompts.push_back(RandomTokens(rng, n, spec_.vocab));
    std::vector<std::vector<float>> alone(3, std::vector<float>(vocab));
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(cache->AddSequence(s, 2048).ok());
      ASSERT_TRUE(
          l.model->Forward({{s, prompts[s]}}, *cache, alone[s].data(), StepKind::kPrompt).ok());
    }
    // The same prompts in one pass (sequences 10..12), with others (20..23) whose lengths vary
    // (long ones too: the attention's work over the batch changes a lot from step to step).
    std::vector<ForwardEntry> batch;
    std::vector<std::vector<int32_t>> others;
    for (int n : {1, 40, 900, 1500}) others.push_back(RandomTokens(rng, n, spec_.vocab));
    for (int s = 0; s < 4; ++s) {
      ASSERT_TRUE(cache->AddSequence(20 + s, 2048).ok());
      batch.push_back({20 + s, others[s]});
    }
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(cache->AddSequence(10 + s, 2048).ok());
      batch.insert(batch.begin() + 2 * s, {10 + s, prompts[s]});
    }
    std::vector<float> together(batch.size() * vocab);
    const absl::Status st = l.model->Forward(batch, *cache, together.data(), StepKind::kPrompt);
    ASSERT_TRUE(st.ok()) << st;
    for (size_t e = 0; e < batch.size(); ++e) {
      if (batch[e].seq >= 20) continue;
      const int s = static_cast<int>(batch[e].seq - 10);
      EXPECT_EQ(FirstDifference(absl::MakeConstSpan(together).subspan(e * vocab, vocab), alone[s]),
                -1)
          << "prompt " << s;
    }
    // Decode steps: each sequence alone, and together in batches of 3 to 7 in shuffled order.
    for (int step = 0; step < 8; ++step) {
      std::vector<int32_t> next(3);
      for (int s = 0; s < 3; ++s) {
        next[s] = static_cast<int32_t>(std::max_element(alone[s].begin(), alone[s].end()) -
                                       alone[s].begin());
        ASSERT_TRUE(l.model
                        ->Forward({{s, absl::MakeConstSpan(&next[s], 1)}}, *cache, alone[s].data(),
                                  StepKind::kDecode)
                        .ok());
      }
      std::vector<int32_t> other_tokens = RandomTokens(rng, 4, spec_.vocab);
      batch.clear();
      for (int s = 0; s < 3; ++s) batch.push_back({10 + s, absl::MakeConstSpan(&next[s], 1)});
      for (int s = 0; s < 4; ++s) {
        if (rng() % 2 == 0) batch.push_back({20 + s, absl::MakeConstSpan(&other_tokens[s], 1)});
      }
      std::shuffle(batch.begin(), batch.end(), rng);
      together.assign(batch.size() * vocab, 0.f);
      ASSERT_TRUE(l.model->Forward(batch, *cache, together.data(), StepKind::kDecode).ok());
      for (size_t e = 0; e < batch.size(); ++e) {
        if (batch[e].seq >= 20) continue;
        const int s = static_cast<int>(batch[e].seq - 10);
        ASSERT_EQ(
            FirstDifference(absl::MakeConstSpan(together).subspan(e * vocab, vocab), alone[s]), -1)
            << "sequence " << s << " at decode step " << step << " in a batch of " << batch.size();
      }
    }
    for (int64_t s : {0, 1, 2, 10, 11, 12, 20, 21, 22, 23}) {
      ASSERT_TRUE(cache->RemoveSequence(s).ok());
    }
    EXPECT_EQ(cache->pool().used_pages(), 0);
  }
}

TEST_P(LlamaTest, CpuMatchesRefBackend) {
  SCOPED_TRACE(seed_);
  kernels::RefBackend ref;
  Loaded lc = Load(spec_, *cpu_, seed_);
  Loaded lr = Load(spec_, ref, seed_);
  std::mt19937_64 rng(seed_ + 2);
  const std::vector<int32_t> tokens = RandomTokens(rng, 9, spec_.vocab);
  const int64_t vocab = lc.model->config().vocab;
  auto c1_owner = MakeCache(spec_, *cpu_), c2_owner = MakeCache(spec_, ref);
  kvstore::PagedKvCache &c1 = *c1_owner, &c2 = *c2_owner;
  ASSERT_TRUE(c1.AddSequence(0, 16).ok());
  ASSERT_TRUE(c2.AddSequence(0, 16).ok());
  std::vector<float> a(vocab), b(vocab);
  ASSERT_TRUE(lc.model->Forward({{0, tokens}}, c1, a.data()).ok());
  ASSERT_TRUE(lr.model->Forward({{0, tokens}}, c2, b.data()).ok());
  EXPECT_LT(MaxRelError(a, b), 1e-4);
}

TEST_P(LlamaTest, RejectsBadInputWithoutCorruptingTheCache) {
  Loaded l = Load(spec_, *cpu_, seed_);
  auto cache_owner = MakeCache(spec_, *cpu_);
  kvstore::PagedKvCache& cache = *cache_owner;
  ASSERT_TRUE(cache.AddSequence(0, 4).ok());
  std::vector<float> logits(l.model->config().vocab);
  const std::vector<int32_t> bad = {1, static_cast<int32_t>(spec_.vocab)};
  EXPECT_THAT(l.model->Forward({{0, bad}}, cache, logits.data()).message(),
              ::testing::HasSubstr("outside the vocabulary"));
  const std::vector<int32_t> too_long = {1, 2, 3, 4, 5};
  EXPECT_EQ(l.model->Forward({{0, too_long}}, cache, logits.data()).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(l.model->Forward({{7, too_long}}, cache, logits.data()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*cache.Length(0), 0);
  const std::vector<int32_t> ok = {1, 2, 3, 4};
  EXPECT_TRUE(l.model->Forward({{0, ok}}, cache, logits.data()).ok());
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, LlamaTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_1),
                         [](const auto& info) {
                           return std::string(kernels::GgmlTypeName(uint32_t(info.param)));
                         });

TEST(LlamaConfig, RejectsUnsupportedArchitecture) {
  testing::GgufWriter w;
  w.AddString("general.architecture", "qwen2");
  auto g = GgufFile::FromBytes(w.Build());
  ASSERT_TRUE(g.ok());
  auto c = LlamaConfig::FromGguf(**g);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("qwen2"));
}

}  // namespace
}  // namespace sluice::model
