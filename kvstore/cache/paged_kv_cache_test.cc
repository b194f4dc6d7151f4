// The paged KV cache: attention over its pages against attention over the same fp32 rows,
// backends agreeing, prefix sharing by fork, errors, and every page back in the pool.
#include "kvstore/cache/paged_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/attention.h"
#include "kernels/ref/ref_backend.h"

namespace sluice::kvstore {
namespace {

constexpr int kLayers = 2, kHeads = 4, kKvHeads = 2, kDim = 32;
constexpr int64_t kRow = kKvHeads * kDim;

std::vector<float> Random(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

std::unique_ptr<PagedKvCache> MakeCache(kernels::Backend& backend, std::string_view preset,
                                        int32_t residual, int64_t pages = 256) {
  auto p = FindKvPreset(preset, kDim, 4096);
  EXPECT_TRUE(p.ok()) << p.status();
  p->residual = residual;
  auto c = PagedKvCache::Create({.layers = kLayers,
                                 .heads = kHeads,
                                 .kv_heads = kKvHeads,
                                 .head_dim = kDim,
                                 .preset = *p,
                                 .pages = pages},
                                backend);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

// Writes `n` tokens (k, v: [layers][n, kv_heads, dim]) to every layer, attends with q
// ([n, heads, dim]) in layer 0 and commits; returns layer 0's attention output.
std::vector<float> Step(PagedKvCache& cache, int64_t seq, const std::vector<float>& k,
                        const std::vector<float>& v, const std::vector<float>& q, int64_t n) {
  std::vector<float> out(n * kHeads * kDim);
  const absl::Status begin = cache.BeginStep({{.seq = seq, .tokens = n}});
  EXPECT_TRUE(begin.ok()) << begin;
  for (int l = 0; l < kLayers; ++l) {
    const absl::Status st = cache.Write(l, k.data() + l * n * kRow, v.data() + l * n * kRow);
    EXPECT_TRUE(st.ok()) << st;
  }
  const absl::Status attend = cache.Attend(0, q.data(), out.data());
  EXPECT_TRUE(attend.ok()) << attend;
  const absl::Status commit = cache.Commit();
  EXPECT_TRUE(commit.ok()) << commit;
  return out;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// A prompt whose every query attends to one token: keys small (x0.1) except the heavy
// hitter's, 30 u in every kv-head and layer; queries 3 u (u: a unit vector); values random.
struct HeavyHitterPrompt {
  std::vector<float> k, v;  // [layers][prompt, kv_heads, dim]
  std::vector<float> q;     // [prompt, heads, dim]
};

std::vector<float> Scaled(std::vector<float> x, float a) {
  for (float& e : x) e *= a;
  return x;
}

HeavyHitterPrompt MakeHeavyHitterPrompt(std::mt19937_64& rng, int64_t prompt, int64_t heavy) {
  std::vector<float> u(kDim, 0.f);
  u[5] = 1.f;
  HeavyHitterPrompt p{.k = Scaled(Random(rng, kLayers * prompt * kRow), 0.1f),
                      .v = Random(rng, kLayers * prompt * kRow)};
  for (int l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kKvHeads; ++h) {
      for (int c = 0; c < kDim; ++c) p.k[(l * prompt + heavy) * kRow + h * kDim + c] = 30.f * u[c];
    }
  }
  for (int64_t t = 0; t < prompt * kHeads; ++t) {
    for (int c = 0; c < kDim; ++c) p.q.push_back(3.f * u[c]);
  }
  return p;
}

// Feeds a prompt of `prompt` tokens, then `steps` tokens one at a time, to sequence `seq`, and
// checks each step's attention against ref attention over all the fp32 rows within `tol`.
void ExpectTracksFullPrecision(PagedKvCache& cache, int64_t seq, int64_t prompt, int64_t steps,
                               double tol, std::mt19937_64& rng) {
  std::vector<float> all_k, all_v;  // layer 0 rows so far
  int64_t len = 0;
  for (int64_t n : {prompt, int64_t{1}}) {
    for (int64_t step = 0; step < (n == 1 ? steps : 1); ++step) {
      const std::vector<float> k = Random(rng, kLayers * n * kRow);
      const std::vector<float> v = Random(rng, kLayers * n * kRow);
      const std::vector<float> q = Random(rng, n * kHeads * kDim);
      const std::vector<float> got = Step(cache, seq, k, v, q, n);
      all_k.insert(all_k.end(), k.begin(), k.begin() + n * kRow);
      all_v.insert(all_v.end(), v.begin(), v.begin() + n * kRow);
      std::vector<float> want(got.size());
      kernels::ref::Attention({.q = q.data(),
                               .k = all_k.data(),
                               .v = all_v.data(),
                               .out = want.data(),
                               .q_tokens = n,
                               .kv_tokens = len + n,
                               .q_start = len,
                               .heads = kHeads,
                               .kv_heads = kKvHeads,
                               .head_dim = kDim,
                               .scale = 1.f / std::sqrt(float(kDim))});
      len += n;
      ASSERT_LT(MaxAbsDiff(got, want), tol) << "after " << len << " tokens";
    }
  }
}

// Feeds 300 tokens (a prompt of 200, then 100 one at a time) and checks each step's attention
// against ref attention over the fp32 rows, within each preset's precision.
// The seed is fresh each run (SLUICE_TEST_SEED repeats one). kvcomp's bound: 5 key and 7 value
// levels on uniform random rows reach 0.62 on some seeds (559966544), so 0.75.
TEST(PagedKvCache, AttentionOverPagesTracksFullPrecision) {
  uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("SLUICE_TEST_SEED"); env != nullptr) {
    ASSERT_TRUE(absl::SimpleAtoi(env, &seed)) << env;
  }
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  for (auto [preset, residual, tol] :
       {std::tuple{"fp16", 0, 2e-3}, std::tuple{"int8", 0, 0.05}, std::tuple{"kivi4", 16, 0.3},
        std::tuple{"kvcomp", 16, 0.75}}) {
    SCOPED_TRACE(preset);
    auto cache = MakeCache(**cpu, preset, residual);
    ASSERT_TRUE(cache->AddSequence(7, 300).ok());
    ExpectTracksFullPrecision(*cache, 7, 200, 100, tol, rng);
    if (HasFatalFailure()) return;
    EXPECT_EQ(*cache->Length(7), 300);
    const KvCacheStats st = cache->Stats();
    EXPECT_GT(st.pages.pages(), 0);
    EXPECT_EQ(st.pages.pages(), cache->pool().used_pages());
    if (std::string_view(preset) != "fp16") {
      EXPECT_GT(st.ratio_vs_fp16(), 1.0);
    }
    ASSERT_TRUE(cache->RemoveSequence(7).ok());
    EXPECT_EQ(cache->pool().used_pages(), 0);
  }
}

TEST(PagedKvCache, CpuAndRefBackendsAgree) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  kernels::RefBackend ref;
  for (const char* preset : {"kivi2", "kvcomp"}) {
    SCOPED_TRACE(preset);
    auto a = MakeCache(**cpu, preset, 8), b = MakeCache(ref, preset, 8);
    ASSERT_TRUE(a->AddSequence(1, 256).ok() && b->AddSequence(1, 256).ok());
    for (int64_t n : {int64_t{70}, int64_t{1}, int64_t{1}, int64_t{3}, int64_t{100}}) {
      const std::vector<float> k = Random(rng, kLayers * n * kRow);
      const std::vector<float> v = Random(rng, kLayers * n * kRow);
      const std::vector<float> q = Random(rng, n * kHeads * kDim);
      EXPECT_LT(MaxAbsDiff(Step(*a, 1, k, v, q, n), Step(*b, 1, k, v, q, n)), 1e-4);
    }
    EXPECT_EQ(a->Stats().pages.pages(), b->Stats().pages.pages());
  }
}

// kvcomp: each layer's codebooks come from the first tokens it compresses and serve every later
// page of every sequence; pages close when their codes fill them, whatever their slot count.
TEST(PagedKvCache, CodedPresetBuildsCodebooksOncePerLayer) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "kvcomp", 0);
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(cache->Codebooks(l).k, nullptr);
  ASSERT_TRUE(cache->AddSequence(1, 512).ok());
  const int64_t n = 64;
  Step(*cache, 1, Random(rng, kLayers * n * kRow), Random(rng, kLayers * n * kRow),
       Random(rng, n * kHeads * kDim), n);
  std::vector<const kernels::HuffmanCodebook*> first;
  for (int l = 0; l < kLayers; ++l) {
    const kernels::KvCodebooks books = cache->Codebooks(l);
    ASSERT_NE(books.k, nullptr);
    ASSERT_NE(books.v, nullptr);
    EXPECT_NE(books.k->id, books.v->id);
    EXPECT_GE(books.k->alphabet_size, 5);
    first.push_back(books.k);
  }
  EXPECT_NE(cache->Codebooks(0).k->id, cache->Codebooks(1).k->id);
  // A second sequence, and many more tokens: the same codebooks.
  ASSERT_TRUE(cache->AddSequence(2, 512).ok());
  for (int i = 0; i < 6; ++i) {
    for (int64_t seq : {1, 2}) {
      Step(*cache, seq, Random(rng, kLayers * n * kRow), Random(rng, kLayers * n * kRow),
           Random(rng, n * kHeads * kDim), n);
    }
  }
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(cache->Codebooks(l).k, first[l]);
  const KvCacheStats st = cache->Stats();
  // 448 tokens of sequence 1 and 384 of sequence 2 in 4 KiB pages: more than 2 pages per list
  // each, and every page's slots in whole units.
  EXPECT_GT(st.pages.pages(), 2 * kLayers * kKvHeads);
  EXPECT_EQ(st.pages.live_slots, (448 + 384) * kLayers * kKvHeads);
  EXPECT_GT(st.ratio_vs_fp16(), 3.0);
  // Two codebooks per layer, 8 bytes of header and a nibble per level each.
  EXPECT_EQ(st.codebook_bytes, kLayers * (8 + 3 + 8 + 4));
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  ASSERT_TRUE(cache->RemoveSequence(2).ok());
  EXPECT_EQ(cache->pool().used_pages(), 0);
}

// A fork shares the full pages of the prefix, copies the partly filled ones, and from then on
// each sequence sees only its own tokens.
TEST(PagedKvCache, ForkSharesFullPagesAndSeparatesWhatFollows) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "int8", 0);
  auto plain = MakeCache(**cpu, "int8", 0);  // the same tokens without sharing
  const int64_t prompt = 150;
  const std::vector<float> k = Random(rng, kLayers * prompt * kRow);
  const std::vector<float> v = Random(rng, kLayers * prompt * kRow);
  const std::vector<float> q = Random(rng, prompt * kHeads * kDim);
  ASSERT_TRUE(cache->AddSequence(1, 200).ok() && plain->AddSequence(2, 200).ok());
  Step(*cache, 1, k, v, q, prompt);
  Step(*plain, 2, k, v, q, prompt);
  const int64_t before = cache->pool().used_pages();
  ASSERT_TRUE(cache->ForkSequence(1, 3, 200).ok());
  // Only the partly filled last page of each (layer, head) is new.
  const int64_t per_page = cache->layout().tokens;
  ASSERT_NE(prompt % per_page, 0);
  EXPECT_EQ(cache->pool().used_pages(), before + kLayers * kKvHeads);
  EXPECT_EQ(cache->Stats().pages.pages(), cache->pool().used_pages());
  // Both continue with different tokens; each must match the unshared cache fed the same.
  auto plain3 = MakeCache(**cpu, "int8", 0);
  ASSERT_TRUE(plain3->AddSequence(3, 200).ok());
  Step(*plain3, 3, k, v, q, prompt);
  for (int step = 0; step < 5; ++step) {
    const std::vector<float> k1 = Random(rng, kLayers * kRow), v1 = Random(rng, kLayers * kRow);
    const std::vector<float> k3 = Random(rng, kLayers * kRow), v3 = Random(rng, kLayers * kRow);
    const std::vector<float> q1 = Random(rng, kHeads * kDim);
    EXPECT_EQ(Step(*cache, 1, k1, v1, q1, 1), Step(*plain, 2, k1, v1, q1, 1));
    EXPECT_EQ(Step(*cache, 3, k3, v3, q1, 1), Step(*plain3, 3, k3, v3, q1, 1));
  }
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  EXPECT_GT(cache->pool().used_pages(), 0);  // sequence 3 still holds the shared prefix
  const std::vector<float> q1 = Random(rng, kHeads * kDim);
  const std::vector<float> k1 = Random(rng, kLayers * kRow), v1 = Random(rng, kLayers * kRow);
  EXPECT_EQ(Step(*cache, 3, k1, v1, q1, 1), Step(*plain3, 3, k1, v1, q1, 1));
  ASSERT_TRUE(cache->RemoveSequence(3).ok());
  EXPECT_EQ(cache->pool().used_pages(), 0);
}

// A step over several sequences plans one page table for all of them and attends once per
// layer; it must do what the same steps do one sequence at a time: the same outputs, and (for
// policies that score and evict) the same tokens kept.
TEST(PagedKvCache, BatchedStepsMatchOneSequenceAtATime) {
  const uint64_t seed = std::random_device{}();
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  for (std::string_view preset : {"kivi4", "h2o", "snapkv", "leankv-k8v4", "kvcomp"}) {
    SCOPED_TRACE(::testing::Message() << preset << " seed " << seed);
    std::mt19937_64 rng(seed);
    auto batched = MakeCache(**cpu, preset, /*residual=*/8);
    auto alone = MakeCache(**cpu, preset, /*residual=*/8);
    const int64_t prompts[] = {40, 17, 70};
    for (int64_t seq = 0; seq < 3; ++seq) {
      ASSERT_TRUE(batched->AddSequence(seq, 200).ok());
      ASSERT_TRUE(alone->AddSequence(seq, 200).ok());
    }
    for (int step = 0; step < 24; ++step) {
      // The prompts in the first step, then one token each; sequence 1 sits out every third.
      std::vector<model::StepEntry> entries;
      for (int64_t seq = 0; seq < 3; ++seq) {
        if (step > 0 && seq == 1 && step % 3 == 0) continue;
        entries.push_back({.seq = seq, .tokens = step == 0 ? prompts[seq] : 1});
      }
      int64_t rows = 0;
      for (const model::StepEntry& e : entries) rows += e.tokens;
      std::vector<std::vector<float>> k(kLayers), v(kLayers), q(kLayers);
      for (int l = 0; l < kLayers; ++l) {
        k[l] = Random(rng, rows * kRow);
        v[l] = Random(rng, rows * kRow);
        q[l] = Random(rng, rows * kHeads * kDim);
      }
      // Every layer's outputs, batched and alone.
      std::vector<std::vector<float>> out(kLayers), want(kLayers);
      ASSERT_TRUE(batched->BeginStep(entries).ok());
      ASSERT_EQ(batched->step()->q_indptr.back(), rows);
      for (int l = 0; l < kLayers; ++l) {
        out[l].resize(rows * kHeads * kDim);
        want[l].resize(rows * kHeads * kDim);
        ASSERT_TRUE(batched->Write(l, k[l].data(), v[l].data()).ok());
        ASSERT_TRUE(batched->Attend(l, q[l].data(), out[l].data()).ok());
      }
      ASSERT_TRUE(batched->Commit().ok());
      int64_t row = 0;
      for (const model::StepEntry& e : entries) {
        ASSERT_TRUE(alone->BeginStep({e}).ok());
        for (int l = 0; l < kLayers; ++l) {
          const int64_t at = row * kRow, qat = row * kHeads * kDim;
          ASSERT_TRUE(alone->Write(l, k[l].data() + at, v[l].data() + at).ok());
          ASSERT_TRUE(alone->Attend(l, q[l].data() + qat, want[l].data() + qat).ok());
        }
        ASSERT_TRUE(alone->Commit().ok());
        row += e.tokens;
      }
      for (int l = 0; l < kLayers; ++l) {
        ASSERT_LT(MaxAbsDiff(out[l], want[l]), 1e-5) << "layer " << l << " step " << step;
      }
    }
    for (int64_t seq = 0; seq < 3; ++seq) {
      ASSERT_EQ(*batched->Length(seq), *alone->Length(seq));
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kKvHeads; ++h) {
          auto a = batched->LiveTokens(seq, l, h);
          auto b = alone->LiveTokens(seq, l, h);
          ASSERT_TRUE(a.ok() && b.ok());
          ASSERT_EQ(a->size(), b->size()) << "sequence " << seq << " layer " << l << " head " << h;
          for (size_t i = 0; i < a->size(); ++i) {
            EXPECT_EQ((*a)[i].position, (*b)[i].position);
            EXPECT_EQ((*a)[i].tier, (*b)[i].tier);
          }
        }
      }
    }
    EXPECT_EQ(batched->pool().used_pages(), alone->pool().used_pages());
  }
}

// The plan's page tables list every (layer, sequence, kv-head)'s pages, tier by tier, as the
// cache holds them, and its write slots follow each sequence's window.
TEST(PagedKvCache, StepPlanListsEveryPageOnce) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "leankv-k8v4", /*residual=*/8);
  const int64_t lengths[] = {90, 33};
  for (int64_t seq = 0; seq < 2; ++seq) {
    ASSERT_TRUE(cache->AddSequence(seq, 200).ok());
    Step(*cache, seq, Random(rng, kLayers * lengths[seq] * kRow),
         Random(rng, kLayers * lengths[seq] * kRow), Random(rng, lengths[seq] * kHeads * kDim),
         lengths[seq]);
  }
  ASSERT_TRUE(cache->BeginStep({{.seq = 1, .tokens = 2}, {.seq = 0, .tokens = 1}}).ok());
  const PagedKvCache::StepPlan& plan = *cache->step();
  EXPECT_THAT(plan.q_indptr, ::testing::ElementsAre(0, 2, 3));
  std::vector<int32_t> seen;
  for (int l = 0; l < kLayers; ++l) {
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t seq = plan.entries[b].seq;
      EXPECT_EQ(plan.recent_tokens[b], plan.write_row[b] + plan.entries[b].tokens);
      for (int h = 0; h < kKvHeads; ++h) {
        auto live = cache->LiveTokens(seq, l, h);
        ASSERT_TRUE(live.ok());
        const int64_t list = (l * 2 + b) * kKvHeads + h;
        int64_t slots = 0;
        for (int t = 0; t < 2; ++t) {
          for (int32_t j = plan.indptr[t][list]; j < plan.indptr[t][list + 1]; ++j) {
            seen.push_back(plan.ids[t][j]);
            slots += plan.slots[t][j];
          }
        }
        // Written slots hold the live tokens and the dead ones.
        EXPECT_GE(slots, static_cast<int64_t>(live->size()));
        if (!live->empty()) EXPECT_GT(slots, 0);
      }
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "a page listed twice";
  EXPECT_EQ(static_cast<int64_t>(seen.size()), cache->pool().used_pages());
  cache->AbortStep();
  EXPECT_EQ(cache->step(), nullptr);
  for (int64_t seq = 0; seq < 2; ++seq) EXPECT_EQ(*cache->Length(seq), lengths[seq]);
}

TEST(PagedKvCache, ErrorsNameTheProblemAndLeaveNothingBehind) {
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "fp16", 0, /*pages=*/6);
  std::vector<float> x(64 * kRow * kLayers, 0.5f), out(64 * kHeads * kDim);
  ASSERT_TRUE(cache->AddSequence(1, 40).ok());
  EXPECT_EQ(cache->AddSequence(1, 40).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(cache->BeginStep({{.seq = 2, .tokens = 1}}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache->BeginStep({{.seq = 1, .tokens = 41}}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->BeginStep({{.seq = 1, .tokens = 0}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cache->BeginStep({{.seq = 1, .tokens = 1}, {.seq = 1, .tokens = 1}}).message(),
              ::testing::HasSubstr("twice"));
  EXPECT_EQ(cache->Write(0, x.data(), x.data()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(cache->BeginStep({{.seq = 1, .tokens = 2}}).ok());
  EXPECT_EQ(cache->BeginStep({{.seq = 1, .tokens = 2}}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache->Attend(0, x.data(), out.data()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache->Write(kLayers, x.data(), x.data()).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(cache->Write(0, x.data(), x.data()).ok());
  EXPECT_EQ(cache->ForkSequence(1, 2, 40).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache->RemoveSequence(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache->Evict(1, 0, 0, {}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cache->Commit().message(), ::testing::HasSubstr("layer 1 did not write"));
  // The failed commit closed the step and dropped what it wrote.
  EXPECT_EQ(*cache->Length(1), 0);
  EXPECT_EQ(cache->step(), nullptr);
  ASSERT_TRUE(cache->ForkSequence(1, 2, 40).ok());
  ASSERT_TRUE(cache->RemoveSequence(2).ok());
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  // 40 tokens of fp16 at head_dim 32 need 2 pages per (layer, head) (a 4 KiB page holds 31):
  // 8 pages, and the pool has 6.
  ASSERT_TRUE(cache->AddSequence(3, 100).ok());
  ASSERT_TRUE(cache->BeginStep({{.seq = 3, .tokens = 40}}).ok());
  for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(cache->Write(l, x.data(), x.data()).ok());
  EXPECT_EQ(cache->Commit().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->pool().used_pages(), 0);  // all or nothing
  ASSERT_TRUE(cache->RemoveSequence(3).ok());
  EXPECT_EQ(cache->RemoveSequence(3).code(), absl::StatusCode::kNotFound);
}

// Layer-0 attention of one query ([kHeads, kDim]) over the rows `keep` of k and v
// ([tokens, kKvHeads, kDim]), by ref.
std::vector<float> RefOverKept(const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<float>& v, const std::vector<int64_t>& keep) {
  std::vector<float> kk, vv;
  for (int64_t t : keep) {
    kk.insert(kk.end(), k.begin() + t * kRow, k.begin() + (t + 1) * kRow);
    vv.insert(vv.end(), v.begin() + t * kRow, v.begin() + (t + 1) * kRow);
  }
  const int64_t n = static_cast<int64_t>(keep.size());
  std::vector<float> out(kHeads * kDim);
  kernels::ref::Attention({.q = q.data(),
                           .k = kk.data(),
                           .v = vv.data(),
                           .out = out.data(),
                           .q_tokens = 1,
                           .kv_tokens = n,
                           .q_start = n - 1,
                           .heads = kHeads,
                           .kv_heads = kKvHeads,
                           .head_dim = kDim,
                           .scale = 1.f / std::sqrt(float(kDim))});
  return out;
}

// Evicted tokens stop counting in attention, pages with no live token go back to the pool,
// tokens still in the full-precision window are evicted when they reach pages, and a page
// shared with a fork is copied before its slots change.
TEST(PagedKvCache, EvictionMasksTokensAndFreesEmptyPages) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "fp16", 16);
  const int64_t n = 300;
  ASSERT_TRUE(cache->AddSequence(1, n + 32).ok());
  const std::vector<float> k = Random(rng, kLayers * n * kRow), v = Random(rng, kLayers * n * kRow);
  Step(*cache, 1, k, v, Random(rng, n * kHeads * kDim), n);
  const int64_t per_page = cache->layout().tokens;  // fp16, head_dim 32, 4 KiB pages
  ASSERT_LT(2 * per_page, n - 16);
  const int64_t pages_before = cache->pool().used_pages();
  // Evict the whole second page and every third token elsewhere, plus tokens still in the
  // 16-token window, in every (layer, head).
  std::vector<int64_t> evicted;
  for (int64_t t = 0; t < n; ++t) {
    if ((t >= per_page && t < 2 * per_page) || t % 3 == 1 || t == n - 5) evicted.push_back(t);
  }
  ASSERT_TRUE(cache->ForkSequence(1, 2, n + 32).ok());  // shares the full pages
  for (int l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kKvHeads; ++h) ASSERT_TRUE(cache->Evict(1, l, h, evicted).ok());
  }
  std::vector<int64_t> keep;
  for (int64_t t = 0; t <= n; ++t) {
    if (!std::binary_search(evicted.begin(), evicted.end(), t)) keep.push_back(t);
  }
  // One more token (kept) moves the window along; n - 5 reaches a page only later, so attend
  // now and compare with the kept set.
  const std::vector<float> k1 = Random(rng, kLayers * kRow), v1 = Random(rng, kLayers * kRow);
  const std::vector<float> q1 = Random(rng, kHeads * kDim);
  std::vector<float> all_k(k.begin(), k.begin() + n * kRow), all_v(v.begin(), v.begin() + n * kRow);
  all_k.insert(all_k.end(), k1.begin(), k1.begin() + kRow);
  all_v.insert(all_v.end(), v1.begin(), v1.begin() + kRow);
  // Evicted tokens still in the 16-token window (from n - 16 on) count until they reach pages.
  std::vector<int64_t> keep_now = keep;
  for (int64_t t : evicted) {
    if (t >= n - 16) keep_now.push_back(t);
  }
  std::sort(keep_now.begin(), keep_now.end());
  EXPECT_LT(MaxAbsDiff(Step(*cache, 1, k1, v1, q1, 1), RefOverKept(q1, all_k, all_v, keep_now)),
            2e-3);
  // The fork kept everything: its shared pages were copied, not changed.
  std::vector<int64_t> all(n + 1);
  for (int64_t t = 0; t <= n; ++t) all[t] = t;
  EXPECT_LT(MaxAbsDiff(Step(*cache, 2, k1, v1, q1, 1), RefOverKept(q1, all_k, all_v, all)), 2e-3);
  // Fill the window past n - 5: now it is evicted too.
  for (int i = 0; i < 16; ++i) {
    const std::vector<float> kx = Random(rng, kLayers * kRow), vx = Random(rng, kLayers * kRow);
    Step(*cache, 1, kx, vx, q1, 1);
  }
  // Sequence 1's second page is gone in every (layer, head); sequence 2 holds its own copies.
  ASSERT_TRUE(cache->RemoveSequence(2).ok());
  // Every (layer, head) holds the kept tokens (n + 17 written, the evicted ones gone) in live
  // slots or in the 16-token window.
  const KvCacheStats st = cache->Stats();
  EXPECT_EQ(st.pages.live_slots + st.residual_tokens,
            kLayers * kKvHeads * (n + 17 - static_cast<int64_t>(evicted.size())));
  EXPECT_LT(cache->pool().used_pages(), pages_before);
  const int64_t live = cache->Stats().pages.live_slots;
  const int64_t paged = cache->Stats().pages.allocated_slots;
  EXPECT_LT(live, paged);
  EXPECT_EQ(cache->Evict(1, 0, 0, {n + 100}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Evict(1, kLayers, 0, {1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Evict(9, 0, 0, {1}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  EXPECT_EQ(cache->pool().used_pages(), 0);
}

// Once a page's worth of slots is dead, the compaction planner packs the live tokens into the
// fewest pages and the emptied pages go back; the moved tokens attend as before and can still be
// evicted by position.
TEST(PagedKvCache, CompactionKeepsTokensAndFreesPages) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "fp16", 0);
  const int64_t n = 200;
  ASSERT_TRUE(cache->AddSequence(1, n + 4).ok());
  const std::vector<float> k = Random(rng, kLayers * n * kRow), v = Random(rng, kLayers * n * kRow);
  Step(*cache, 1, k, v, Random(rng, n * kHeads * kDim), n);
  const int64_t cap = cache->layout().tokens, lists = kLayers * kKvHeads;
  std::vector<int64_t> odd, keep;
  for (int64_t t = 0; t < n; ++t) (t % 2 == 1 ? odd : keep).push_back(t);
  for (int l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kKvHeads; ++h) ASSERT_TRUE(cache->Evict(1, l, h, odd).ok());
  }
  const int64_t pages = (n / 2 + cap - 1) / cap;
  EXPECT_EQ(cache->pool().used_pages(), lists * pages);
  EXPECT_EQ(cache->Stats().pages.live_slots, lists * n / 2);
  EXPECT_GT(cache->Stats().compactions, 0);
  // Position 2 has moved or its neighbours have; evicting it by position still finds it.
  for (int l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kKvHeads; ++h) ASSERT_TRUE(cache->Evict(1, l, h, {2}).ok());
  }
  keep.erase(keep.begin() + 1);
  const std::vector<float> k1 = Random(rng, kLayers * kRow), v1 = Random(rng, kLayers * kRow);
  const std::vector<float> q1 = Random(rng, kHeads * kDim);
  std::vector<float> all_k(k.begin(), k.begin() + n * kRow), all_v(v.begin(), v.begin() + n * kRow);
  all_k.insert(all_k.end(), k1.begin(), k1.begin() + kRow);
  all_v.insert(all_v.end(), v1.begin(), v1.begin() + kRow);
  keep.push_back(n);
  EXPECT_LT(MaxAbsDiff(Step(*cache, 1, k1, v1, q1, 1), RefOverKept(q1, all_k, all_v, keep)), 2e-3);
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  EXPECT_EQ(cache->pool().used_pages(), 0);
}

// sinks keeps the first 4 tokens and the most recent ones, a quarter of the sequence in all;
// snapkv keeps a quarter of the prompt, its last 32 tokens among them, and every generated one;
// pyramid does so with more in the lower layer.
TEST(PagedKvCache, SinksAndSnapKvKeepTheirBudget) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  const int64_t prompt = 400, steps = 40;
  for (const char* preset : {"sinks", "snapkv", "pyramid"}) {
    SCOPED_TRACE(preset);
    auto cache = MakeCache(**cpu, preset, 0);
    ASSERT_TRUE(cache->AddSequence(1, prompt + steps).ok());
    std::vector<float> all_k = Random(rng, kLayers * prompt * kRow);
    std::vector<float> all_v = Random(rng, kLayers * prompt * kRow);
    // The prompt attends in every layer, as the model does: snapkv selects per layer.
    const std::vector<float> pq = Random(rng, prompt * kHeads * kDim);
    std::vector<float> pout(pq.size());
    ASSERT_TRUE(cache->BeginStep({{.seq = 1, .tokens = prompt}}).ok());
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(
          cache->Write(l, all_k.data() + l * prompt * kRow, all_v.data() + l * prompt * kRow).ok());
    }
    for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(cache->Attend(l, pq.data(), pout.data()).ok());
    ASSERT_TRUE(cache->Commit().ok());
    all_k.resize(prompt * kRow);  // layer 0's rows, which the checks below attend over
    all_v.resize(prompt * kRow);
    for (int64_t i = 0; i < steps; ++i) {
      const std::vector<float> k1 = Random(rng, kLayers * kRow), v1 = Random(rng, kLayers * kRow);
      const std::vector<float> q1 = Random(rng, kHeads * kDim);
      all_k.insert(all_k.end(), k1.begin(), k1.begin() + kRow);
      all_v.insert(all_v.end(), v1.begin(), v1.begin() + kRow);
      const std::vector<float> got = Step(*cache, 1, k1, v1, q1, 1);
      if (std::string_view(preset) == "sinks") {
        // Before this step's commit: 4 sinks and the recent tokens of the budget at length
        // prompt + i, plus the new token.
        const int64_t len = prompt + i;
        const int64_t keep = static_cast<int64_t>(std::ceil(0.25 * len));
        std::vector<int64_t> kept = {0, 1, 2, 3};
        for (int64_t t = len - (keep - 4); t <= len; ++t) kept.push_back(t);
        EXPECT_LT(MaxAbsDiff(got, RefOverKept(q1, all_k, all_v, kept)), 2e-3) << "step " << i;
      }
    }
    const KvCacheStats st = cache->Stats();
    const int64_t lists = kLayers * kKvHeads;
    if (std::string_view(preset) == "sinks") {
      EXPECT_EQ(st.pages.live_slots,
                lists * static_cast<int64_t>(std::ceil(0.25 * (prompt + steps))));
    } else if (std::string_view(preset) == "snapkv") {
      EXPECT_EQ(st.pages.live_slots,
                lists * (static_cast<int64_t>(std::ceil(0.25 * prompt)) + steps));
      EXPECT_LT(st.pages.allocated_slots - st.pages.live_slots, cache->layout().tokens * lists);
    } else {
      // Layer 0 keeps 0.25 * (2 - 1/7) of the prompt, the top layer 0.25 / 7, but never less
      // than the 32-token observation window.
      int64_t want = 0;
      for (int l = 0; l < kLayers; ++l) {
        const float b = PyramidBudget(cache->preset().policy, l, kLayers);
        want += std::max<int64_t>(32, static_cast<int64_t>(std::ceil(b * prompt))) + steps;
      }
      EXPECT_EQ(st.pages.live_slots, kKvHeads * want);
      // Dropped prompt tokens never took a slot.
      EXPECT_LT(st.pages.allocated_slots - st.pages.live_slots, cache->layout().tokens * lists);
    }
    EXPECT_GT(st.ratio_vs_fp16(), 2.0);
    ASSERT_TRUE(cache->RemoveSequence(1).ok());
    EXPECT_EQ(cache->pool().used_pages(), 0);
  }
}

TEST(KvPolicy, PyramidBudgetsFallWithDepthAndAverageTheBudget) {
  const KvPolicy policy{.kind = KvPolicyKind::kPyramid, .budget = 0.25f};
  double sum = 0;
  for (int l = 0; l < 30; ++l) {
    sum += PyramidBudget(policy, l, 30);
    if (l > 0) {
      EXPECT_LT(PyramidBudget(policy, l, 30), PyramidBudget(policy, l - 1, 30));
    }
  }
  EXPECT_NEAR(sum / 30, 0.25, 1e-6);
  EXPECT_FLOAT_EQ(PyramidBudget(policy, 0, 30), 0.25f * (2.f - 1.f / 7.f));
  EXPECT_FLOAT_EQ(PyramidBudget(policy, 29, 30), 0.25f / 7.f);
  EXPECT_FLOAT_EQ(PyramidBudget({.budget = 0.8f}, 0, 30), 1.f);  // capped
}

// h2o keeps a quarter of the tokens: the recent half of that and the heavy hitters. A token
// every query attends to strongly survives the evictions and still dominates attention.
TEST(PagedKvCache, H2oKeepsTheHeavyHitter) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "h2o", 0);
  // Ties in score keep the earlier token: a heavy hitter late in the prompt survives only by
  // its score.
  const int64_t prompt = 200, steps = 60, heavy = 150;
  ASSERT_TRUE(cache->AddSequence(1, prompt + steps + 1).ok());
  const HeavyHitterPrompt hh = MakeHeavyHitterPrompt(rng, prompt, heavy);
  const std::vector<float>& v = hh.v;
  Step(*cache, 1, hh.k, hh.v, hh.q, prompt);
  const std::vector<float> q1(hh.q.begin(), hh.q.begin() + kHeads * kDim);
  std::vector<float> out;
  for (int64_t i = 0; i < steps; ++i) {
    out = Step(*cache, 1, Scaled(Random(rng, kLayers * kRow), 0.1f), Random(rng, kLayers * kRow),
               q1, 1);
  }
  // Attention is on the heavy hitter: each query head's output is its kv-head's value row.
  for (int h = 0; h < kHeads; ++h) {
    const int64_t kvh = h / (kHeads / kKvHeads);
    for (int c = 0; c < kDim; ++c) {
      EXPECT_NEAR(out[h * kDim + c], v[heavy * kRow + kvh * kDim + c], 0.05) << "head " << h;
    }
  }
  const int64_t len = prompt + steps;
  EXPECT_EQ(cache->Stats().pages.live_slots,
            kLayers * kKvHeads * static_cast<int64_t>(std::ceil(0.25 * len)));
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  EXPECT_EQ(cache->pool().used_pages(), 0);
}

// Coded pages come one at a time; when the pool runs dry part way, every list goes back to
// where it was and the sequence carries on once pages are free.
TEST(PagedKvCache, CodedFlushThatRunsOutOfPagesRollsBack) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "kvcomp", 0, /*pages=*/10);
  ASSERT_TRUE(cache->AddSequence(1, 1024).ok());
  ASSERT_TRUE(cache->AddSequence(2, 1024).ok());
  const int64_t n = 32;
  Step(*cache, 1, Random(rng, kLayers * n * kRow), Random(rng, kLayers * n * kRow),
       Random(rng, n * kHeads * kDim), n);
  const int64_t used = cache->pool().used_pages();
  EXPECT_EQ(used, kLayers * kKvHeads);
  // 1024 tokens need far more than the 6 pages left.
  const int64_t big = 1024 - n - 1;
  const std::vector<float> k = Random(rng, kLayers * big * kRow);
  ASSERT_TRUE(cache->BeginStep({{.seq = 1, .tokens = big}}).ok());
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(cache->Write(l, k.data() + l * big * kRow, k.data() + l * big * kRow).ok());
  }
  EXPECT_EQ(cache->Commit().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->pool().used_pages(), used);
  // The pages already written still attend as before the failed flush (a step aborted after).
  std::vector<float> out(kHeads * kDim);
  const std::vector<float> one = Random(rng, kRow);
  ASSERT_TRUE(cache->BeginStep({{.seq = 1, .tokens = 1}}).ok());
  for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(cache->Write(l, one.data(), one.data()).ok());
  EXPECT_TRUE(cache->Attend(0, Random(rng, kHeads * kDim).data(), out.data()).ok());
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
  cache->AbortStep();
  // Another sequence still gets the free pages.
  Step(*cache, 2, Random(rng, kLayers * n * kRow), Random(rng, kLayers * n * kRow),
       Random(rng, n * kHeads * kDim), n);
  EXPECT_EQ(cache->pool().used_pages(), 2 * used);
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  ASSERT_TRUE(cache->RemoveSequence(2).ok());
  EXPECT_EQ(cache->pool().used_pages(), 0);
}

// At the extremes of its thresholds leankv keeps every token, in one tier: all high
// (alpha_high = 0) or all low (alpha_low = 0 and an unreachable alpha_high). Attention then
// tracks full precision within that tier's precision.
TEST(PagedKvCache, LeanKvAtExtremeThresholdsKeepsEveryTokenInOneTier) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  for (auto [alpha_high, tier, tol] : {std::tuple{0.f, 0, 0.3}, std::tuple{1e9f, 1, 0.6}}) {
    SCOPED_TRACE(tier);
    auto cache =
        MakeCache(**cpu, absl::StrCat("leankv-k8v4:alpha_high=", alpha_high, ":alpha_low=0"), 8);
    ASSERT_TRUE(cache->AddSequence(3, 200).ok());
    ExpectTracksFullPrecision(*cache, 3, 120, 60, tol, rng);
    if (HasFatalFailure()) return;
    const int64_t len = 180;
    const KvCacheStats st = cache->Stats();
    EXPECT_EQ(st.pages.live_slots, kLayers * kKvHeads * (len - 8));
    EXPECT_EQ(tier == 0 ? st.pages.pages_low : st.pages.pages_high, 0);
    EXPECT_EQ(st.demoted, 0);
    auto live = cache->LiveTokens(3, 1, 1);
    ASSERT_TRUE(live.ok());
    ASSERT_EQ(static_cast<int64_t>(live->size()), len - 8);
    for (size_t i = 0; i < live->size(); ++i) {
      EXPECT_EQ((*live)[i].position, static_cast<int64_t>(i));  // in order, none missing
      EXPECT_EQ((*live)[i].tier, tier);
    }
    ASSERT_TRUE(cache->RemoveSequence(3).ok());
    EXPECT_EQ(cache->pool().used_pages(), 0);
  }
}

// A first token every query attends to is significant and stays in the high tier; the others
// get almost no attention, fall below alpha_low / N and go, at the prompt and at every step.
TEST(PagedKvCache, LeanKvKeepsTheHeavyHitterAndEvictsTheRest) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  const int32_t window = 16;
  // alpha_high 0 < alpha_low: every token is high-tier at the prompt, and each step's least
  // significant token goes (Algorithm 1, line 10), so the count stays where the prompt left it.
  for (const float alpha_high : {1.f, 0.f}) {
    SCOPED_TRACE(alpha_high);
    auto cache = MakeCache(
        **cpu, absl::StrCat("leankv-k8v4:alpha_high=", alpha_high, ":alpha_low=0.1"), window);
    const int64_t prompt = 200, steps = 60, heavy = 0;
    ASSERT_TRUE(cache->AddSequence(1, prompt + steps).ok());
    const HeavyHitterPrompt hh = MakeHeavyHitterPrompt(rng, prompt, heavy);
    const std::vector<float>&k = hh.k, &v = hh.v;
    // Every layer attends, as the model does: each scores its own tokens.
    std::vector<float> pout(hh.q.size());
    ASSERT_TRUE(cache->BeginStep({{.seq = 1, .tokens = prompt}}).ok());
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(cache->Write(l, k.data() + l * prompt * kRow, v.data() + l * prompt * kRow).ok());
    }
    for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(cache->Attend(l, hh.q.data(), pout.data()).ok());
    ASSERT_TRUE(cache->Commit().ok());
    const std::vector<float> q1(hh.q.begin(), hh.q.begin() + kHeads * kDim);
    std::vector<float> out(kHeads * kDim);
    for (int64_t i = 0; i < steps; ++i) {
      const std::vector<float> k1 = Scaled(Random(rng, kLayers * kRow), 0.1f);
      const std::vector<float> v1 = Random(rng, kLayers * kRow);
      ASSERT_TRUE(cache->BeginStep({{.seq = 1, .tokens = 1}}).ok());
      for (int l = 0; l < kLayers; ++l) {
        ASSERT_TRUE(cache->Write(l, k1.data() + l * kRow, v1.data() + l * kRow).ok());
      }
      for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(cache->Attend(l, q1.data(), out.data()).ok());
      ASSERT_TRUE(cache->Commit().ok());
    }
    // Attention is on the heavy hitter: each query head's output is its kv-head's value row
    // (int4 values).
    for (int h = 0; h < kHeads; ++h) {
      const int64_t kvh = h / (kHeads / kKvHeads);
      for (int c = 0; c < kDim; ++c) {
        EXPECT_NEAR(out[h * kDim + c],
                    v[(kLayers - 1) * prompt * kRow + heavy * kRow + kvh * kDim + c], 0.3)
            << "head " << h;
      }
    }
    for (int l = 0; l < kLayers; ++l) {
      for (int64_t h = 0; h < kKvHeads; ++h) {
        auto live = cache->LiveTokens(1, l, h);
        ASSERT_TRUE(live.ok());
        const size_t want = alpha_high > 0 ? 1 : prompt - window;
        ASSERT_EQ(live->size(), want) << "layer " << l << " kv-head " << h;
        EXPECT_EQ((*live)[0].position, heavy);
        for (const auto& t : *live) EXPECT_EQ(t.tier, 0);
      }
    }
    ASSERT_TRUE(cache->RemoveSequence(1).ok());
    EXPECT_EQ(cache->pool().used_pages(), 0);
  }
}

// Random keys and queries with thresholds in between: tokens land in both tiers, some are
// demoted during generation and some evicted; every live token is in exactly one place, the
// counts add up, a fork carries on alone, and every page comes back.
TEST(PagedKvCache, LeanKvTiersStayConsistentThroughGeneration) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  const int32_t window = 8;
  auto cache = MakeCache(**cpu, "leankv-k4v2:alpha_high=1.5:alpha_low=0.6", window);
  const int64_t prompt = 150, steps = 150;
  ASSERT_TRUE(cache->AddSequence(1, prompt + steps).ok());
  auto attend_all = [&](int64_t seq, int64_t n) {
    const std::vector<float> k = Random(rng, kLayers * n * kRow);
    const std::vector<float> v = Random(rng, kLayers * n * kRow);
    const std::vector<float> q = Random(rng, n * kHeads * kDim);
    std::vector<float> out(q.size());
    ASSERT_TRUE(cache->BeginStep({{.seq = seq, .tokens = n}}).ok());
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(cache->Write(l, k.data() + l * n * kRow, v.data() + l * n * kRow).ok());
    }
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(cache->Attend(l, q.data(), out.data()).ok());
      for (float x : out) ASSERT_TRUE(std::isfinite(x));
    }
    ASSERT_TRUE(cache->Commit().ok());
  };
  auto check = [&](int64_t seq) {
    const int64_t len = *cache->Length(seq);
    int64_t live_total = 0;
    for (int l = 0; l < kLayers; ++l) {
      for (int64_t h = 0; h < kKvHeads; ++h) {
        auto live = cache->LiveTokens(seq, l, h);
        ASSERT_TRUE(live.ok());
        std::vector<int64_t> positions;
        for (const auto& t : *live) {
          ASSERT_TRUE(t.tier == 0 || t.tier == 1);
          ASSERT_LT(t.position, len - window);
          positions.push_back(t.position);
        }
        std::sort(positions.begin(), positions.end());
        ASSERT_TRUE(std::adjacent_find(positions.begin(), positions.end()) == positions.end())
            << "a token live twice";
        live_total += static_cast<int64_t>(positions.size());
      }
    }
    if (cache->Stats().sequences == 1) {
      EXPECT_EQ(cache->Stats().pages.live_slots, live_total);
    }
  };
  attend_all(1, prompt);
  check(1);
  for (int64_t i = 0; i < steps / 2; ++i) {
    attend_all(1, 1);
    check(1);
  }
  ASSERT_TRUE(cache->ForkSequence(1, 2, prompt + steps).ok());
  for (int64_t i = 0; i < steps / 2; ++i) {
    attend_all(1, 1);
    attend_all(2, 1);
    check(1);
    check(2);
  }
  ASSERT_TRUE(cache->RemoveSequence(2).ok());
  check(1);
  const KvCacheStats st = cache->Stats();
  EXPECT_GT(st.pages.pages_high, 0);
  EXPECT_GT(st.pages.pages_low, 0);
  EXPECT_GT(st.demoted, 0);
  EXPECT_LT(st.pages.live_slots, kLayers * kKvHeads * (prompt + steps - window));  // some went
  EXPECT_GT(st.ratio_vs_fp16(), 1.0);
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  EXPECT_EQ(cache->pool().used_pages(), 0);
}

// MiniKV keeps a pyramid of prompt tokens chosen at the end of the prompt (the last 32 always)
// in 2-bit pages, and every generated token: the selection persists.
TEST(PagedKvCache, MiniKvKeepsItsPromptSelectionAndEveryGeneratedToken) {
  std::mt19937_64 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto cache = MakeCache(**cpu, "minikv", 0);
  const int64_t prompt = 400, steps = 40;
  ASSERT_TRUE(cache->AddSequence(1, prompt + steps).ok());
  const std::vector<float> k = Random(rng, kLayers * prompt * kRow);
  const std::vector<float> v = Random(rng, kLayers * prompt * kRow);
  const std::vector<float> q = Random(rng, prompt * kHeads * kDim);
  std::vector<float> out(q.size());
  ASSERT_TRUE(cache->BeginStep({{.seq = 1, .tokens = prompt}}).ok());
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(cache->Write(l, k.data() + l * prompt * kRow, v.data() + l * prompt * kRow).ok());
  }
  for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(cache->Attend(l, q.data(), out.data()).ok());
  ASSERT_TRUE(cache->Commit().ok());
  for (int64_t i = 0; i < steps; ++i) {
    Step(*cache, 1, Random(rng, kLayers * kRow), Random(rng, kLayers * kRow),
         Random(rng, kHeads * kDim), 1);
  }
  // Pages take 32-token groups: 416 of the 440 tokens are in pages, 400 of them the prompt's.
  int64_t want = 0;
  for (int l = 0; l < kLayers; ++l) {
    const float b = PyramidBudget(cache->preset().policy, l, kLayers);
    const int64_t kept = std::max<int64_t>(32, static_cast<int64_t>(std::ceil(b * prompt)));
    want += kept + 16;
    auto live = cache->LiveTokens(1, l, 0);
    ASSERT_TRUE(live.ok());
    EXPECT_EQ(static_cast<int64_t>(live->size()), kept + 16);
    // The observation window and the generated tokens all stay.
    std::vector<int64_t> positions;
    for (const auto& t : *live) positions.push_back(t.position);
    for (int64_t p = prompt - 32; p < prompt + 16; ++p) {
      EXPECT_TRUE(std::binary_search(positions.begin(), positions.end(), p)) << p;
    }
  }
  const KvCacheStats st = cache->Stats();
  EXPECT_EQ(st.pages.live_slots, kKvHeads * want);
  // The dropped prompt tokens took no slot; only the last group of the prompt was padded.
  EXPECT_LT(st.pages.allocated_slots - st.pages.live_slots,
            (cache->layout().tokens + 32) * kLayers * kKvHeads);
  EXPECT_GT(st.ratio_vs_fp16(), 3.0);  // half the prompt in 2-bit pages, small test shapes
  ASSERT_TRUE(cache->RemoveSequence(1).ok());
  EXPECT_EQ(cache->pool().used_pages(), 0);
}

}  // namespace
}  // namespace sluice::kvstore
