// Trial formats against what they emulate: the kivi trial attends as the one-tier preset's pages
// do and counts the same bytes; the tc trial is near exact at 8 bits and loses more at fewer;
// bad specs are named.
#include "tools/trial_kv_cache.h"

#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"

namespace sluice::tools {
namespace {

model::LlamaConfig Config() {
  model::LlamaConfig c;
  c.layers = 2;
  c.heads = 6;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.rope_dim = 64;
  c.rope_theta = 10000.f;
  return c;
}

// Rows [n, kv_heads * head_dim] with channel-wise offsets and scales (keys' outlier channels),
// a few components carrying most of the variance, and a first token far out (a sink).
std::vector<float> Rows(std::mt19937& rng, int64_t n, int64_t dim, int64_t first) {
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> offset(dim), scale(dim), mix(8 * dim);
  std::mt19937 fixed(7);  // the same channels' structure for every call
  for (int64_t j = 0; j < dim; ++j) {
    offset[j] = 0.5f * g(fixed);
    scale[j] = j % 16 == 3 ? 3.f : 0.3f;
  }
  for (float& m : mix) m = g(fixed);
  std::vector<float> rows(n * dim);
  for (int64_t t = 0; t < n; ++t) {
    float z[8];
    for (float& x : z) x = g(rng);
    for (int64_t j = 0; j < dim; ++j) {
      float x = offset[j] + 0.2f * scale[j] * g(rng);
      for (int a = 0; a < 8; ++a) x += 0.5f * mix[a * dim + j] * z[a];
      rows[t * dim + j] = (first + t == 0) ? 8.f * x : x;
    }
  }
  return rows;
}

struct Outputs {
  std::vector<float> out;  // every decode step's attention, all layers
  int64_t held = 0, fp16 = 0;
};

// A prompt of `prompt` tokens then `steps` decode steps of one sequence, the same rows into
// `cache`; returns the attention outputs.
Outputs Drive(model::KvCache& cache, const model::LlamaConfig& c, int64_t prompt, int64_t steps,
              uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t dim = c.kv_heads * c.head_dim, q_row = c.heads * c.head_dim;
  Outputs r;
  EXPECT_TRUE(cache.AddSequence(0, prompt + steps).ok());
  int64_t pos = 0;
  for (int64_t s = 0; s <= steps; ++s) {
    const int64_t n = s == 0 ? prompt : 1;
    EXPECT_TRUE(cache.BeginStep({{.seq = 0, .tokens = n}}).ok());
    for (int layer = 0; layer < c.layers; ++layer) {
      const std::vector<float> k = Rows(rng, n, dim, pos), v = Rows(rng, n, dim, pos);
      std::vector<float> q = Rows(rng, n, q_row, 1), out(n * q_row);
      EXPECT_TRUE(cache.Write(layer, k.data(), v.data()).ok());
      EXPECT_TRUE(cache.Attend(layer, q.data(), out.data()).ok());
      if (s > 0) r.out.insert(r.out.end(), out.begin(), out.end());
    }
    EXPECT_TRUE(cache.Commit().ok());
    pos += n;
  }
  return r;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

TEST(TrialKvCache, KiviAttendsAsThePresetsPagesAndCountsTheSameBytes) {
  const model::LlamaConfig c = Config();
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto preset = kvstore::FindKvPreset("sluice", 64);
  ASSERT_TRUE(preset.ok());
  auto paged = kvstore::PagedKvCache::Create({.layers = c.layers,
                                              .heads = c.heads,
                                              .kv_heads = c.kv_heads,
                                              .head_dim = c.head_dim,
                                              .preset = *preset,
                                              .pages = 64},
                                             **cpu);
  ASSERT_TRUE(paged.ok()) << paged.status();
  auto format = ParseTrialFormat("kivi:exact=fp32");
  ASSERT_TRUE(format.ok());
  auto trial = TrialKvCache::Create(*format, c, **cpu, nullptr);
  ASSERT_TRUE(trial.ok()) << trial.status();
  const Outputs want = Drive(**paged, c, 300, 70, 1);
  const Outputs got = Drive(**trial, c, 300, 70, 1);
  ASSERT_EQ(got.out.size(), want.out.size());
  // The same codes (one quantizer), read in another order.
  EXPECT_LT(RelativeError(got.out, want.out), 1e-5);
  EXPECT_EQ((*trial)->held_bytes(), (*paged)->Stats().held_bytes());
  EXPECT_EQ((*trial)->fp16_bytes(), (*paged)->Stats().fp16_bytes());

  // The window in fp16 holds fewer bytes and changes the attention by little.
  auto fp16 = TrialKvCache::Create(*ParseTrialFormat("kivi"), c, **cpu, nullptr);
  ASSERT_TRUE(fp16.ok());
  const Outputs half = Drive(**fp16, c, 300, 70, 1);
  EXPECT_LT((*fp16)->held_bytes(), (*trial)->held_bytes());
  EXPECT_LT(RelativeError(half.out, want.out), 1e-2);
}

TEST(TrialKvCache, TransformCodesLoseLessWithMoreBits) {
  const model::LlamaConfig c = Config();
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  const int64_t dim = c.kv_heads * c.head_dim;
  TrialBases bases;
  std::mt19937 rng(3);
  for (int layer = 0; layer < c.layers; ++layer) {
    const std::vector<float> rows = Rows(rng, 2000, dim, 1);
    for (auto* b : {&bases.k_pre, &bases.k_post, &bases.v}) {
      auto basis = kvstore::FitKvTransformBasis(rows.data(), 2000, static_cast<int32_t>(dim));
      ASSERT_TRUE(basis.ok());
      b->push_back(*std::move(basis));
    }
  }
  // Exact attention: every row kept.
  auto exact =
      TrialKvCache::Create(*ParseTrialFormat("kivi:window=100000:exact=fp32"), c, **cpu, nullptr);
  ASSERT_TRUE(exact.ok());
  const Outputs want = Drive(**exact, c, 300, 40, 2);
  double last = 0;
  int64_t last_bytes = 0;
  for (const char* spec : {"tc:kb=8:vb=8:sinks=4:steps=minmax", "tc:kb=4:vb=4:sinks=4:steps=minmax",
                           "tc:kb=1:vb=1:sinks=4:steps=minmax"}) {
    SCOPED_TRACE(spec);
    auto trial = TrialKvCache::Create(*ParseTrialFormat(spec), c, **cpu, &bases);
    ASSERT_TRUE(trial.ok()) << trial.status();
    const Outputs got = Drive(**trial, c, 300, 40, 2);
    const double err = RelativeError(got.out, want.out);
    if (last == 0) {
      EXPECT_LT(err, 2e-2);
    } else {
      EXPECT_GT(err, last);
      EXPECT_LT((*trial)->held_bytes(), last_bytes);
    }
    last = err;
    last_bytes = (*trial)->held_bytes();
  }
  // Without bases the tc format is refused.
  EXPECT_THAT(TrialKvCache::Create(*ParseTrialFormat("tc"), c, **cpu, nullptr).status().message(),
              ::testing::HasSubstr("needs bases"));
}

TEST(TrialKvCache, BadSpecsAreNamed) {
  EXPECT_THAT(ParseTrialFormat("zip").status().message(), ::testing::HasSubstr("unknown format"));
  EXPECT_THAT(ParseTrialFormat("kivi:kb=9").status().message(), ::testing::HasSubstr("kb=9"));
  EXPECT_THAT(ParseTrialFormat("tc:kb=0").status().message(), ::testing::HasSubstr("kb=0"));
  EXPECT_THAT(ParseTrialFormat("tc:steps=odd").status().message(),
              ::testing::HasSubstr("steps=odd"));
  EXPECT_THAT(ParseTrialFormat("kivi:steps=group").status().message(),
              ::testing::HasSubstr("unknown setting 'steps'"));
  EXPECT_THAT(ParseTrialFormat("kivi:window").status().message(),
              ::testing::HasSubstr("not key=value"));
  auto f = ParseTrialFormat("tc:kb=1.5:vb=3:rope=pre:sinks=4:steps=group:exact=fp32");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->k_budget, 1.5);
  EXPECT_EQ(f->v_budget, 3);
  EXPECT_TRUE(f->keys_pre_rope);
  EXPECT_EQ(f->sinks, 4);
  EXPECT_EQ(f->steps, TrialFormat::Steps::kGroup);
  EXPECT_TRUE(f->fp32_exact);
  const model::LlamaConfig c = Config();
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  EXPECT_THAT(
      TrialKvCache::Create(*ParseTrialFormat("kivi:kg=64"), c, **cpu, nullptr).status().message(),
      ::testing::HasSubstr("do not divide the flush group"));
  EXPECT_THAT(
      TrialKvCache::Create(*ParseTrialFormat("kivi:kb=3"), c, **cpu, nullptr).status().message(),
      ::testing::HasSubstr("not 3"));
}

}  // namespace
}  // namespace sluice::tools
