// The Llama forward on every backend against the cpu backend's, on tiny random models: a batch
// of two prompts, then batched decode steps fed the cpu run's greedy tokens, through paged
// caches on the same backend (fp16 pages, 4-bit KIVI pages). On cuda the weights, activations
// and KV pages are device memory; its case runs under the emulation of CUDA in CI
// (llama_backends_test_emu) and on a GPU where there is one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/test_util/backend_cases.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "model/llama.h"
#include "model/test_util/tiny_cache.h"
#include "model/test_util/tiny_llama.h"

namespace sluice::model {
namespace {

using kernels::testing::BackendCase;

std::unique_ptr<kvstore::PagedKvCache> MakeCache(const testing::TinyLlamaSpec& spec,
                                                 kernels::Backend& backend,
                                                 const std::string& preset, int32_t residual) {
  auto cache = testing::MakeTinyCache(spec, backend, preset, residual, /*pages=*/256);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

int32_t Argmax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

// The gap between the best and the second-best logit.
float Margin(const float* logits, int64_t vocab) {
  float best = -INFINITY, second = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] > best) {
      second = best;
      best = logits[i];
    } else if (logits[i] > second) {
      second = logits[i];
    }
  }
  return best - second;
}

class LlamaBackendsTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    auto backend = GetParam().create();
    if (!backend.ok()) GTEST_SKIP() << GetParam().name << " skipped: " << backend.status();
    backend_ = std::move(*backend);
    auto cpu = kernels::CpuBackend::Create();
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<kernels::CpuBackend> cpu_;
};

// With bf16 (device backends only) the weights go to the device as bf16 and the matmuls run
// with bf16 operands: logits within bf16's rounding, the same clear greedy picks.
void CheckAgainstCpu(kernels::Backend& backend, kernels::Backend& cpu, bool bf16);

// Recorded steps against the same model's ops issued one by one (see the test below).
void CheckRecordedSteps(kernels::Backend& backend, bool bf16);

TEST_P(LlamaBackendsTest, PrefillAndGreedyDecodeMatchCpu) {
  CheckAgainstCpu(*backend_, *cpu_, /*bf16=*/false);
}

TEST_P(LlamaBackendsTest, Bf16WeightsOnTheDeviceStayCloseToCpu) {
  if (backend_->memory_space() != kernels::MemorySpace::kDevice) {
    GTEST_SKIP() << "host backends keep the GGUF types";
  }
  CheckAgainstCpu(*backend_, *cpu_, /*bf16=*/true);
}

void CheckAgainstCpu(kernels::Backend& backend, kernels::Backend& cpu, bool bf16) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << backend.name() << " seed " << seed << " bf16 " << bf16);
  testing::TinyLlamaSpec spec;
  auto gguf = GgufFile::FromBytes(testing::BuildTinyLlamaGguf(spec, seed));
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto want_model = LlamaModel::Load(**gguf, cpu);
  auto got_model = LlamaModel::Load(**gguf, backend, {.bf16_on_device = bf16});
  ASSERT_TRUE(want_model.ok()) << want_model.status();
  ASSERT_TRUE(got_model.ok()) << got_model.status();
  const int64_t vocab = (*want_model)->config().vocab;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (const int n : {13, 29}) {
    std::vector<int32_t> p(n);
    for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
    prompts.push_back(p);
  }

  // fp16 pages from the first token on; 4-bit KIVI pages behind an 8-token window.
  for (auto [preset, residual, exact_tol] :
       {std::tuple{"fp16", 0, 1e-4f}, std::tuple{"kivi4", 8, 2e-3f}}) {
    SCOPED_TRACE(preset);
    const float tol = bf16 ? 1e-2f : exact_tol;  // bf16 operands: about 3e-3 seen
    auto want_cache = MakeCache(spec, cpu, preset, residual);
    auto got_cache = MakeCache(spec, backend, preset, residual);
    ASSERT_TRUE(want_cache && got_cache);
    std::vector<ForwardEntry> batch;
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(want_cache->AddSequence(s, 64).ok());
      ASSERT_TRUE(got_cache->AddSequence(s, 64).ok());
      batch.push_back({s, prompts[s]});
    }
    std::vector<float> want(2 * vocab), got(2 * vocab);
    int clear = 0, agree = 0;
    std::vector<std::vector<int32_t>> next(2, std::vector<int32_t>(1));
    for (int step = 0; step < 16; ++step) {
      ASSERT_TRUE((*want_model)->Forward(batch, *want_cache, want.data()).ok());
      const absl::Status st = (*got_model)->Forward(batch, *got_cache, got.data());
      ASSERT_TRUE(st.ok()) << st;
      float worst = 0, scale = 0;
      for (int64_t i = 0; i < 2 * vocab; ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << "logit " << i << " at step " << step;
        worst = std::max(worst, std::fabs(got[i] - want[i]));
        scale = std::max(scale, std::fabs(want[i]));
      }
      EXPECT_LE(worst, tol * scale) << "step " << step;
      for (int s = 0; s < 2; ++s) {
        const float* w = want.data() + s * vocab;
        const float* g = got.data() + s * vocab;
        // Where the cpu's best token leads by more than the tolerance, the greedy pick is the
        // same; both runs go on with the cpu's pick.
        if (Margin(w, vocab) > 2 * tol * scale) {
          ++clear;
          agree += Argmax(g, vocab) == Argmax(w, vocab);
        }
        next[s][0] = Argmax(w, vocab);
        batch[s] = {s, next[s]};
      }
    }
    EXPECT_EQ(agree, clear);
    EXPECT_GT(clear, bf16 ? 8 : 16) << "too few clear greedy picks to compare";
    std::printf("%s %s: %d of 32 greedy picks clear of the tolerance, %d of them agree\n",
                backend.name().c_str(), preset, clear, agree);
    EXPECT_GT(got_cache->pool().used_pages(), 0);
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(got_cache->RemoveSequence(s).ok());
      ASSERT_TRUE(want_cache->RemoveSequence(s).ok());
    }
    EXPECT_EQ(got_cache->pool().used_pages(), 0);
  }
}

// Recorded steps (CUDA graphs) against the same model's ops issued one by one, on the same
// backend: the same logits to rounding at every step, through row counts that are recorded (1-16),
// one that is not (a 40-token prompt) and the scratch growth it causes, after which the small row
// counts are recorded again on the new buffers.
TEST_P(LlamaBackendsTest, RecordedStepsMatchOpsIssuedOneByOne) {
  if (!backend_->CanRecord()) GTEST_SKIP() << backend_->name() << " records no ops";
  // bf16 off: the GGUF-typed matmuls expand their weights in the backend's workspace, which
  // cannot be recorded, so every step runs unrecorded, with the same results.
  for (const bool bf16 : {true, false}) CheckRecordedSteps(*backend_, bf16);
}

void CheckRecordedSteps(kernels::Backend& backend, bool bf16) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << backend.name() << " seed " << seed << " bf16 " << bf16);
  testing::TinyLlamaSpec spec;
  auto gguf = GgufFile::FromBytes(testing::BuildTinyLlamaGguf(spec, seed));
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto recorded = LlamaModel::Load(**gguf, backend, {.bf16_on_device = bf16, .record_steps = true});
  auto direct = LlamaModel::Load(**gguf, backend, {.bf16_on_device = bf16, .record_steps = false});
  ASSERT_TRUE(recorded.ok() && direct.ok());
  const int64_t vocab = (*recorded)->config().vocab;
  auto recorded_cache = MakeCache(spec, backend, "kivi4", 8);
  auto direct_cache = MakeCache(spec, backend, "kivi4", 8);
  ASSERT_TRUE(recorded_cache && direct_cache);
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> tokens(3);
  // (sequence, new tokens) per step; a sequence's first entry is its prompt.
  const std::vector<std::vector<std::pair<int, int>>> steps = {{{0, 3}},
                                                               {{0, 1}},
                                                               {{0, 1}},
                                                               {{1, 40}},
                                                               {{0, 1}, {1, 1}},
                                                               {{0, 1}, {1, 1}},
                                                               {{2, 5}},
                                                               {{0, 1}, {1, 1}, {2, 1}},
                                                               {{0, 1}, {1, 1}, {2, 1}},
                                                               {{0, 1}}};
  int64_t most_recorded = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<ForwardEntry> batch;
    for (auto [s, n] : steps[i]) {
      if (tokens[s].empty()) {
        ASSERT_TRUE(recorded_cache->AddSequence(s, 64).ok());
        ASSERT_TRUE(direct_cache->AddSequence(s, 64).ok());
      }
      tokens[s].clear();
      for (int t = 0; t < n; ++t) tokens[s].push_back(static_cast<int32_t>(rng() % vocab));
      batch.push_back({s, tokens[s]});
    }
    std::vector<float> want(batch.size() * vocab), got(batch.size() * vocab);
    ASSERT_TRUE((*direct)->Forward(batch, *direct_cache, want.data()).ok());
    const absl::Status st = (*recorded)->Forward(batch, *recorded_cache, got.data());
    ASSERT_TRUE(st.ok()) << st;
    // Attention sums its split parts with shared-memory atomics, so two runs of the same step
    // agree to rounding, not bit for bit; a replay on stale buffers or parameters is far off.
    float worst = 0, scale = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      worst = std::max(worst, std::fabs(got[j] - want[j]));
      scale = std::max(scale, std::fabs(want[j]));
    }
    ASSERT_LE(worst, 1e-5f * scale) << "step " << i;
    EXPECT_EQ((*direct)->recorded_segments(), 0);
    most_recorded = std::max(most_recorded, (*recorded)->recorded_segments());
    if (bf16 && i == 2) {
      EXPECT_EQ((*recorded)->recorded_segments(), 2 * (spec.layers + 1));  // 3 and 1 rows
    }
    if (i == 3) EXPECT_EQ((*recorded)->recorded_segments(), 0);  // the scratch grew
  }
  // With bf16: 1, 2, 3 and 5 rows recorded.
  EXPECT_EQ((*recorded)->recorded_segments(), bf16 ? 4 * (spec.layers + 1) : 0);
  EXPECT_EQ(most_recorded, bf16 ? 4 * (spec.layers + 1) : 0);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, LlamaBackendsTest,
                         ::testing::ValuesIn(kernels::testing::BackendsUnderTest()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::model
