// The batched GPU decode attention (DecodeAttentionPlan) against ref::PagedAttention run on each
// sequence alone: mixed tiers (Huffman-coded too), ragged page fill, dead slots, different
// recent lengths per sequence, and chunkings from one page per chunk to the plan's choice.
// Skipped, with the reason, where no GPU is.
#include "kernels/cuda/decode_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/device_testing.h"
#include "kernels/kv_format.h"
#include "kernels/ref/kv_quant.h"
#include "kernels/ref/paged_attention.h"
#include "kernels/test_util/backend_cases.h"
#include "kernels/test_util/kv_coded_pages.h"

namespace sluice::kernels::cuda {
namespace {

using testing::OnGpu;

// Every tier kind in one plan (the generic kernel), or with kivi_bits one KIVI tier (the KIVI
// kernel: sluice and kivi4 with 4 bits, kivi2 and minikv with 2).
std::vector<KvTierFormat> Formats(int d, int kivi_bits = 0) {
  const auto i = [](int bits, KvGrouping g, int group, int levels = 0) {
    return KvQuantSpec{
        .codec = KvCodec::kInt, .bits = bits, .grouping = g, .group = group, .levels = levels};
  };
  if (kivi_bits != 0) {
    return {{.k = i(kivi_bits, KvGrouping::kPerChannel, 32),
             .v = i(kivi_bits, KvGrouping::kPerToken, 32),
             .head_dim = d,
             .page_bytes = 16384}};
  }
  return {
      // sluice: int4 keys per channel over 32 tokens, int4 values per 32 channels.
      {.k = i(4, KvGrouping::kPerChannel, 32),
       .v = i(4, KvGrouping::kPerToken, 32),
       .head_dim = d,
       .page_bytes = 16384},
      // leankv's high tier: int8 keys per token, with token meta.
      {.k = i(8, KvGrouping::kPerToken, 0),
       .v = i(4, KvGrouping::kPerToken, 32),
       .head_dim = d,
       .page_bytes = 8192,
       .token_meta = true},
      {.head_dim = d, .page_bytes = 8192},  // fp16
      // kvcomp: Huffman-coded.
      {.k = i(8, KvGrouping::kPerChannel, 32, 5),
       .v = i(8, KvGrouping::kPerToken, 0, 7),
       .head_dim = d,
       .page_bytes = 8192,
       .huffman_bits = 2.4f},
  };
}

struct Case {
  int batch, heads, kv_heads, d, max_pages, chunk;
  int kivi_bits = 0;
};

#ifdef SLUICE_CUDA_EMU
using PlanCost = sluice::emu::RuntimeCounters;
#else
struct PlanCost {};
#endif

// One batch of random sequences over every tier kind, against the reference per sequence; the
// plan built in `workspace` when one is given. Under the emulation, *cost gets the runtime calls
// of the plan's Create and Run.
void CheckBatch(const Case& c, std::mt19937_64& rng, uint64_t seed,
                DecodeAttentionWorkspace* workspace = nullptr, PlanCost* cost = nullptr) {
  SCOPED_TRACE(::testing::Message()
               << "batch=" << c.batch << " heads=" << c.heads << "/" << c.kv_heads << " d=" << c.d
               << " kivi=" << c.kivi_bits << " seed=" << seed);
  const std::vector<KvTierFormat> formats = Formats(c.d, c.kivi_bits);
  std::vector<KvPageLayout> layouts;
  for (const KvTierFormat& f : formats) layouts.push_back(ComputePageLayout(f).value());
  std::vector<KvCodebooks> books(formats.size());
  const std::vector<float> sample_k = testing::RandomFloats(rng, 256 * c.d, -2, 2);
  const std::vector<float> sample_v = testing::RandomFloats(rng, 256 * c.d, -2, 2);
  auto owned = testing::CodebooksFromRows(Formats(c.d)[3], sample_k.data(), sample_v.data(), 256);
  ASSERT_TRUE(owned.ok()) << owned.status();
  if (c.kivi_bits == 0) books[3] = (*owned)->view();

  std::vector<std::vector<uint8_t>> host_pages;
  std::vector<KvPageRef> pages;  // host data pointers, for the reference
  std::vector<int32_t> offsets = {0};
  std::vector<int64_t> recent_offsets = {0};
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.kv_heads; ++h) {
      const int n = static_cast<int>(rng() % (c.max_pages + 1));
      for (int i = 0; i < n; ++i) {
        const int tier = static_cast<int>(rng() % formats.size());
        const KvTierFormat& f = formats[tier];
        const KvPageLayout& l = layouts[tier];
        const int64_t groups = l.tokens / l.token_group;
        int64_t slots = l.token_group * (1 + static_cast<int64_t>(rng() % groups));
        const std::vector<float> k = testing::RandomFloats(rng, slots * c.d, -2, 2);
        const std::vector<float> v = testing::RandomFloats(rng, slots * c.d, -2, 2);
        std::vector<uint8_t> bytes(f.page_bytes, 0);
        if (f.huffman_bits > 0) {
          auto written =
              testing::RefCodedWrite(f, books[tier], k.data(), v.data(), slots, 0, bytes.data());
          ASSERT_TRUE(written.ok()) << written.status();
          slots = *written;
        } else {
          ref::KvQuantize({.k = HostView(k),
                           .v = HostView(v),
                           .stride = c.d,
                           .tokens = slots,
                           .format = f,
                           .layout = l,
                           .page = HostView(bytes)});
        }
        uint64_t* valid = reinterpret_cast<uint64_t*>(bytes.data() + l.valid);
        for (int64_t s = 0; s < slots; ++s) {
          if (rng() % 5 == 0) valid[s / 64] &= ~(uint64_t{1} << (s % 64));
        }
        host_pages.push_back(std::move(bytes));
        pages.push_back({.data = nullptr, .slots = static_cast<int32_t>(slots), .tier = tier});
      }
      offsets.push_back(static_cast<int32_t>(pages.size()));
    }
    recent_offsets.push_back(recent_offsets.back() + 1 + static_cast<int64_t>(rng() % 70));
  }
  for (size_t i = 0; i < pages.size(); ++i) pages[i].data = host_pages[i].data();
  const int64_t recent_total = recent_offsets.back();
  const std::vector<float> q = testing::RandomFloats(rng, c.batch * c.heads * c.d, -2, 2);
  const std::vector<float> rk = testing::RandomFloats(rng, recent_total * c.kv_heads * c.d, -2, 2);
  const std::vector<float> rv = testing::RandomFloats(rng, recent_total * c.kv_heads * c.d, -2, 2);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.d));

  // The reference, one sequence at a time.
  std::vector<float> want(q.size());
  for (int b = 0; b < c.batch; ++b) {
    std::vector<int32_t> seq_offsets;
    for (int h = 0; h <= c.kv_heads; ++h) {
      seq_offsets.push_back(offsets[b * c.kv_heads + h] - offsets[b * c.kv_heads]);
    }
    const int64_t r0 = recent_offsets[b], rn = recent_offsets[b + 1] - r0;
    ASSERT_TRUE(ref::PagedAttention({.q = q.data() + b * c.heads * c.d,
                                     .out = want.data() + b * c.heads * c.d,
                                     .q_tokens = 1,
                                     .heads = c.heads,
                                     .kv_heads = c.kv_heads,
                                     .head_dim = c.d,
                                     .scale = scale,
                                     .formats = formats.data(),
                                     .layouts = layouts.data(),
                                     .codebooks = books.data(),
                                     .tier_count = static_cast<int32_t>(formats.size()),
                                     .pages = pages.data() + offsets[b * c.kv_heads],
                                     .page_offsets = seq_offsets.data(),
                                     .recent_k = rk.data() + r0 * c.kv_heads * c.d,
                                     .recent_v = rv.data() + r0 * c.kv_heads * c.d,
                                     .recent_tokens = rn})
                    .ok());
  }

  // The same on the GPU, all sequences in one plan.
  std::vector<DeviceArray<uint8_t>> device_pages;
  std::vector<KvPageRef> device_refs = pages;
  for (size_t i = 0; i < pages.size(); ++i) {
    device_pages.push_back(OnGpu(host_pages[i]));
    device_refs[i].data = device_pages.back().data();
  }
  const DeviceArray<float> dq = OnGpu(q), drk = OnGpu(rk), drv = OnGpu(rv);
  const DeviceArray<float> dout = OnGpu(std::vector<float>(q.size(), NAN));
#ifdef SLUICE_CUDA_EMU
  const PlanCost before = sluice::emu::Counters();
#endif
  // Each sequence's window: pointers into the packed device rows.
  std::vector<const float*> recent_k, recent_v;
  for (size_t b = 0; b + 1 < recent_offsets.size(); ++b) {
    recent_k.push_back(drk.data() + recent_offsets[b] * c.kv_heads * c.d);
    recent_v.push_back(drv.data() + recent_offsets[b] * c.kv_heads * c.d);
  }
  auto plan = DecodeAttentionPlan::Create({.batch = c.batch,
                                           .q_tokens = 1,
                                           .heads = c.heads,
                                           .kv_heads = c.kv_heads,
                                           .head_dim = c.d,
                                           .scale = scale,
                                           .formats = formats.data(),
                                           .layouts = layouts.data(),
                                           .codebooks = books.data(),
                                           .tier_count = static_cast<int32_t>(formats.size()),
                                           .pages = device_refs.data(),
                                           .page_offsets = offsets.data(),
                                           .recent_offsets = recent_offsets.data(),
                                           .recent_k = recent_k.data(),
                                           .recent_v = recent_v.data(),
                                           .pages_per_chunk = c.chunk},
                                          nullptr, workspace);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The KIVI kernel takes head_dim 128 at 2 or 4 bits and 64 at 4 bits.
  const bool kivi = c.kivi_bits == 4 || (c.kivi_bits == 2 && c.d == 128);
  EXPECT_EQ(plan->kernel(), kivi ? "kivi" + std::to_string(c.kivi_bits) : "generic");
  ASSERT_TRUE(plan->Run(dq.data(), dout.data(), nullptr).ok());
#ifdef SLUICE_CUDA_EMU
  if (cost != nullptr) *cost = sluice::emu::Counters() - before;
#endif
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(q.size());
  ASSERT_EQ(cudaMemcpy(got.data(), dout.data(), got.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  testing::ExpectNear(got, want, {2e-4f}, 2e-4f, "out");
}

TEST(DecodeAttentionPlan, BatchMatchesReferencePerSequence) {
  if (absl::Status gpu = CudaDeviceAvailable(); !gpu.ok()) GTEST_SKIP() << gpu;
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const Case c : {Case{3, 32, 8, 128, 6, 1}, Case{5, 9, 3, 64, 9, 0}, Case{2, 4, 1, 64, 4, 3},
                       Case{1, 8, 8, 128, 12, 2}}) {
    CheckBatch(c, rng, seed);
  }
}

// The KIVI kernel: 4- and 2-bit pages, head_dim 128 and 64, GQA groups of 4 (Llama-3), 3
// (SmolLM2), 1 and 6 (two row blocks), pages in chunks of 1 to the plan's choice, partly
// filled pages, dead slots, and sequences with no pages (recent tokens only); 2-bit pages with
// head_dim 64 go to the generic kernel.
TEST(DecodeAttentionPlan, KiviKernelMatchesReference) {
  if (absl::Status gpu = CudaDeviceAvailable(); !gpu.ok()) GTEST_SKIP() << gpu;
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (const Case c :
       {Case{3, 32, 8, 128, 5, 1, 4}, Case{3, 9, 3, 64, 6, 0, 4}, Case{2, 8, 8, 128, 3, 2, 2},
        Case{2, 12, 2, 128, 7, 0, 2}, Case{1, 4, 1, 64, 3, 0, 2}}) {
    CheckBatch(c, rng, seed);
  }
}

// A small batch of each kernel (the ThreadSanitizer run of the emulation takes this one).
TEST(DecodeAttentionPlan, SmallBatchMatchesReference) {
  if (absl::Status gpu = CudaDeviceAvailable(); !gpu.ok()) GTEST_SKIP() << gpu;
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  CheckBatch({2, 4, 1, 64, 3, 1}, rng, seed);
  CheckBatch({2, 4, 1, 64, 3, 1, 4}, rng, seed);
}

// Plans built one after another in one workspace (a decode loop's steps) give the right results,
// and once the workspace has grown, building one allocates nothing and waits for nothing (the
// emulation counts the runtime calls).
TEST(DecodeAttentionPlan, PlansInAWorkspaceAllocateOnce) {
  if (absl::Status gpu = CudaDeviceAvailable(); !gpu.ok()) GTEST_SKIP() << gpu;
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  DecodeAttentionWorkspace workspace;
  CheckBatch({5, 32, 8, 128, 12, 1}, rng, seed, &workspace);
  const int64_t grown = workspace.device_bytes();
  ASSERT_GT(grown, 0);
  for (const Case c : {Case{2, 4, 1, 64, 3, 1}, Case{3, 9, 3, 64, 4, 0}}) {
    PlanCost cost;
    CheckBatch(c, rng, seed, &workspace, &cost);
    EXPECT_EQ(workspace.device_bytes(), grown);
#ifdef SLUICE_CUDA_EMU
    EXPECT_EQ(cost.device_allocations, 0);
    EXPECT_EQ(cost.device_frees, 0);
    EXPECT_EQ(cost.host_allocations, 0);
    EXPECT_EQ(cost.blocking_calls, 0);
#endif
  }
}

// Shapes are checked before any CUDA call: this runs without a GPU too.
// The launches' length in ChoosePagesPerChunk's model, written out on its own: per layer, waves
// of `wave` page blocks times the longest chunk plus the fixed pages, and the recent-only
// blocks' fixed pages over the wave.
int64_t ChunkingCost(const std::vector<int32_t>& offsets, int64_t layers, int64_t row_groups,
                     int64_t wave, bool recent_chunk, int64_t size) {
  const int64_t per_layer = (static_cast<int64_t>(offsets.size()) - 1) / layers;
  int64_t cost = 0;
  for (int64_t l = 0; l < layers; ++l) {
    int64_t blocks = 0, recent_blocks = 0, longest = 0;
    for (int64_t i = l * per_layer; i < (l + 1) * per_layer; ++i) {
      const int64_t n = offsets[i + 1] - offsets[i];
      int64_t pieces = 0;
      while (pieces * size < n) ++pieces;
      blocks += pieces;
      if (recent_chunk || pieces == 0) ++recent_blocks;
      for (int64_t k = 0; k < pieces; ++k) {
        longest = std::max(longest, n * (k + 1) / pieces - n * k / pieces);
      }
    }
    cost += (blocks * row_groups + wave - 1) / wave * (longest + kChunkFixedPages);
    cost += (recent_blocks * row_groups * kChunkFixedPages + wave - 1) / wave;
  }
  return cost;
}

std::vector<int32_t> Offsets(const std::vector<int32_t>& pages) {
  std::vector<int32_t> offsets = {0};
  for (const int32_t n : pages) offsets.push_back(offsets.back() + n);
  return offsets;
}

TEST(ChoosePagesPerChunk, FillsWholeWaves) {
  // 32 sequences x 8 kv-heads x 171 pages (16k tokens of sluice pages) on 132 SMs x 4 blocks:
  // a wave's share, 83 pages, makes 3 chunks a list, 768 blocks, a wave and a half; 86 pages
  // make 2, 512 blocks, one wave.
  const std::vector<int32_t> b32 = Offsets(std::vector<int32_t>(256, 171));
  EXPECT_EQ(ChoosePagesPerChunk(b32, 1, 1, 528, /*recent_chunk=*/false), 86);
  // 8 sequences: 9 chunks a list of 19 pages would be 576 blocks; 8 of 22 fit one wave.
  const std::vector<int32_t> b8 = Offsets(std::vector<int32_t>(64, 171));
  EXPECT_EQ(ChoosePagesPerChunk(b8, 1, 1, 528, false), 22);
  // A chunk of its own for each list's recent tokens adds short blocks, not waves.
  EXPECT_EQ(ChoosePagesPerChunk(b32, 1, 1, 528, /*recent_chunk=*/true), 86);
  // Two row groups double the blocks.
  EXPECT_EQ(ChoosePagesPerChunk(b8, 1, 2, 528, false), 43);
  // One short list: a page a chunk.
  EXPECT_EQ(ChoosePagesPerChunk(Offsets({3}), 1, 1, 528, false), 1);
  EXPECT_EQ(ChoosePagesPerChunk(Offsets({0, 0}), 1, 1, 528, false), 1);
}

TEST(ChoosePagesPerChunk, BeatsAWavesShareAndFindsTheBestForAlikeLists) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t layers = 1 + rng() % 3, lists = 1 + rng() % 300, wave = 8 + rng() % 600;
    const int64_t row_groups = 1 + rng() % 2;
    const bool recent_chunk = rng() % 2 == 0;
    // Ragged lists, or every list alike (a uniform batch).
    const bool uniform = rng() % 2 == 0;
    std::vector<int32_t> pages;
    const int32_t most = 1 + rng() % 400;
    for (int64_t i = 0; i < layers * lists; ++i) {
      pages.push_back(uniform ? most : static_cast<int32_t>(rng() % (most + 1)));
    }
    const std::vector<int32_t> offsets = Offsets(pages);
    const int64_t chosen = ChoosePagesPerChunk(offsets, layers, row_groups, wave, recent_chunk);
    const int64_t longest = *std::max_element(pages.begin(), pages.end());
    ASSERT_GE(chosen, 1);
    ASSERT_LE(chosen, std::max<int64_t>(1, longest));
    // A wave's share of a layer's pages per block, what plans used before.
    const int64_t share =
        std::max<int64_t>(1, (offsets.back() / layers * row_groups + wave - 1) / wave);
    int64_t best = -1;
    for (int64_t size = 1; size <= std::max<int64_t>(1, longest); ++size) {
      const int64_t c = ChunkingCost(offsets, layers, row_groups, wave, recent_chunk, size);
      if (best < 0 || c < best) best = c;
    }
    const int64_t cost = ChunkingCost(offsets, layers, row_groups, wave, recent_chunk, chosen);
    EXPECT_LE(cost, ChunkingCost(offsets, layers, row_groups, wave, recent_chunk, share))
        << "trial " << trial;
    // Alike lists: every size cuts them as one of the tried sizes does, and the best wins.
    if (uniform) {
      EXPECT_EQ(cost, best) << "trial " << trial << ": chose " << chosen;
    }
  }
}

TEST(DecodeAttentionPlan, RejectsBadShapes) {
  const int32_t offsets[2] = {0, 0};
  const int64_t recent[2] = {0, 1};
  DecodeBatch b{.batch = 1,
                .q_tokens = 1,
                .heads = 4,
                .kv_heads = 1,
                .head_dim = 72,
                .page_offsets = offsets,
                .recent_offsets = recent};
  EXPECT_EQ(DecodeAttentionPlan::Create(b, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  b.head_dim = 64;
  b.heads = 6;
  b.kv_heads = 4;
  EXPECT_EQ(DecodeAttentionPlan::Create(b, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  b.heads = 4;
  b.kv_heads = 1;
  b.q_tokens = 2;  // more queries than recent tokens
  EXPECT_EQ(DecodeAttentionPlan::Create(b, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels::cuda
