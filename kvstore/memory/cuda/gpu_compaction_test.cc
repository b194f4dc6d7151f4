// GPU compaction against the host: for random batches of page lists (ragged, empty, untouched,
// fully evicted), every tier layout the GPU supports, the plans must equal PlanCompaction's and
// the arena must end byte-identical to PlanCompaction + ApplyCompaction with KvMoveSlot copies
// (or, for K grouped along tokens, whole-group copies). The sparse copy is checked the same way.
// Argument checks run everywhere; the rest skip, saying why, where there is no CUDA device.
#include "kvstore/memory/cuda/gpu_compaction.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_array.h"
#include "kernels/kv_format.h"
#include "kernels/test_util/backend_cases.h"
#include "kvstore/memory/compaction.h"
#include "kvstore/memory/slot_bitmap.h"

namespace sluice::kvstore::cuda {

using kernels::cuda::CudaDeviceAvailable;
using kernels::cuda::CudaEvent;
using kernels::cuda::DeviceArray;
using kernels::cuda::PinnedArray;
namespace {

using kernels::KvCodec;
using kernels::KvGrouping;
using kernels::KvPageLayout;
using kernels::KvQuantSpec;
using kernels::KvTierFormat;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

#define SKIP_WITHOUT_CUDA_DEVICE()                                                    \
  do {                                                                                \
    if (absl::Status s = CudaDeviceAvailable(); !s.ok()) GTEST_SKIP() << s.message(); \
  } while (0)

using kernels::testing::TestSeed;

struct FormatCase {
  std::string name;
  KvTierFormat format;
};

KvQuantSpec Spec(KvCodec codec, int32_t bits, KvGrouping grouping = KvGrouping::kPerToken,
                 int32_t group = 0, int32_t block_channels = 0) {
  return {.codec = codec,
          .bits = bits,
          .grouping = grouping,
          .group = group,
          .block_channels = block_channels};
}

std::vector<FormatCase> Formats() {
  const KvQuantSpec f16 = Spec(KvCodec::kF16, 16);
  return {
      {"f16", {.k = f16, .v = f16, .head_dim = 32, .page_bytes = 4096}},
      {"fp8_meta",
       {.k = Spec(KvCodec::kFp8, 8, KvGrouping::kPerToken, 32),
        .v = Spec(KvCodec::kFp8, 8),
        .head_dim = 64,
        .page_bytes = 4096,
        .token_meta = true}},
      {"k8tiled_v4_meta",
       {.k = Spec(KvCodec::kInt, 8),
        .v = Spec(KvCodec::kInt, 4, KvGrouping::kPerToken, 32),
        .head_dim = 64,
        .page_bytes = 4096,
        .token_meta = true}},
      {"k2v2_128slots",
       {.k = Spec(KvCodec::kInt, 2, KvGrouping::kPerToken, 32),
        .v = Spec(KvCodec::kInt, 2, KvGrouping::kPerToken, 32),
        .head_dim = 32,
        .page_bytes = 4096,
        .token_meta = true}},
      {"k4channel16_v4",
       {.k = Spec(KvCodec::kInt, 4, KvGrouping::kPerChannel, 16),
        .v = Spec(KvCodec::kInt, 4, KvGrouping::kPerToken, 32),
        .head_dim = 64,
        .page_bytes = 4096,
        .token_meta = true}},
      {"k2block32x16_v2",
       {.k = Spec(KvCodec::kInt, 2, KvGrouping::kBlock, 32, 16),
        .v = Spec(KvCodec::kInt, 2),
        .head_dim = 64,
        .page_bytes = 4096}},
  };
}

// Host reference for moving slots where K is grouped along tokens (KvMoveSlot covers only
// token_group 1): every code bit by bit through KvCodePositionOf, V rows and per-token metadata,
// scores and positions, and each whole group's K (scale, zero) pairs. Validity bits are left to
// ApplyCompaction.
void MoveGroupSlots(const KvTierFormat& f, const KvPageLayout& l, const uint8_t* src,
                    int32_t src_slot, uint8_t* dst, int32_t dst_slot, int32_t slots) {
  const int32_t d = f.head_dim;
  const int mask = (1 << f.k.bits) - 1;
  for (int32_t k = 0; k < slots; ++k) {
    const int64_t s = src_slot + k, t = dst_slot + k;
    for (int c = 0; c < d; ++c) {
      const kernels::KvCodePosition from = kernels::KvCodePositionOf(f.k, d, l.k_tile, s, c);
      const kernels::KvCodePosition to = kernels::KvCodePositionOf(f.k, d, l.k_tile, t, c);
      const int code = (src[l.k_codes + from.byte] >> from.shift) & mask;
      uint8_t& b = dst[l.k_codes + to.byte];
      b = static_cast<uint8_t>((b & ~(mask << to.shift)) | (code << to.shift));
    }
    std::memmove(dst + l.v_codes + t * l.v_row_bytes, src + l.v_codes + s * l.v_row_bytes,
                 l.v_row_bytes);
    if (f.v.codec != KvCodec::kF16) {
      const int planes = d / kernels::KvGroupOf(f.v, d) * (f.v.codec == KvCodec::kInt ? 2 : 1);
      const uint16_t* from = reinterpret_cast<const uint16_t*>(src + l.v_meta);
      uint16_t* to = reinterpret_cast<uint16_t*>(dst + l.v_meta);
      for (int p = 0; p < planes; ++p) to[p * l.tokens + t] = from[p * l.tokens + s];
    }
    if (f.token_meta) {
      std::memmove(dst + l.scores + t * 4, src + l.scores + s * 4, 4);
      std::memmove(dst + l.positions + t * 4, src + l.positions + s * 4, 4);
    }
  }
  // kernels/ref/kv_quant.cc: group g's scales then zeros, `blocks` fp16 each.
  const int32_t g = l.token_group;
  const int32_t blocks = f.k.grouping == KvGrouping::kBlock ? d / f.k.block_channels : d;
  const int32_t bytes = blocks * 4;
  for (int32_t u = 0; u < slots / g; ++u) {
    std::memmove(dst + l.k_meta + (dst_slot / g + u) * bytes,
                 src + l.k_meta + (src_slot / g + u) * bytes, bytes);
  }
}

// Copies `slots` slots the host way: KvMoveSlot per slot for token_group 1, else
// MoveGroupSlots.
void HostMove(const KvTierFormat& f, const KvPageLayout& l, const uint8_t* src, int32_t src_slot,
              uint8_t* dst, int32_t dst_slot, int32_t slots) {
  if (l.token_group == 1) {
    for (int32_t k = 0; k < slots; ++k) {
      kernels::KvMoveSlot(f, l, src, src_slot + k, dst, dst_slot + k);
    }
  } else {
    MoveGroupSlots(f, l, src, src_slot, dst, dst_slot, slots);
  }
}

// A random arena: random bytes everywhere (stale bits past used_slots included), and page lists
// whose live slots are evicted at a per-list rate.
struct Batch {
  int64_t num_pages = 0;
  int64_t page_bytes = 0;
  std::vector<uint8_t> arena;  // host copy
  std::vector<int64_t> offsets{0};
  std::vector<PageId> ids;
  std::vector<int32_t> used;

  uint8_t* page(PageId id) { return arena.data() + int64_t{id} * page_bytes; }
  uint64_t* bits(PageId id, const KvPageLayout& l) {
    return reinterpret_cast<uint64_t*>(page(id) + l.valid);
  }
};

Batch RandomBatch(std::mt19937_64& rng, const KvPageLayout& l, int64_t page_bytes, int lists,
                  int max_pages) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<int64_t> sizes(lists);
  int64_t total = 0;
  for (int64_t& n : sizes) total += (n = uniform(0, 4) == 0 ? 0 : uniform(1, max_pages));
  Batch b;
  b.num_pages = total + 17;  // pages in no list stay as they are
  b.page_bytes = page_bytes;
  b.arena.resize(b.num_pages * page_bytes);
  for (uint8_t& x : b.arena) x = static_cast<uint8_t>(rng());
  std::vector<PageId> perm(b.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const double rates[] = {0.0, 0.05, 0.3, 0.6, 0.95, 1.0};
  int64_t next = 0;
  for (int64_t n : sizes) {
    const double evict = rates[uniform(0, 5)];
    for (int64_t i = 0; i < n; ++i) {
      const PageId id = perm[next++];
      int32_t used = l.tokens;  // full pages, the last one partly written
      if (i + 1 == n || uniform(0, 9) == 0) used = static_cast<int32_t>(uniform(0, l.tokens));
      uint64_t* bits = b.bits(id, l);
      for (int32_t s = 0; s < used; ++s) {
        if (std::bernoulli_distribution(1.0 - evict)(rng)) {
          SetSlot(bits, s);
        } else {
          ClearSlot(bits, s);
        }
      }
      b.ids.push_back(id);
      b.used.push_back(used);
    }
    b.offsets.push_back(static_cast<int64_t>(b.ids.size()));
  }
  return b;
}

class GpuCompactionFormats : public ::testing::TestWithParam<FormatCase> {};

// Many lists in one launch against PlanCompaction + ApplyCompaction, list by list.
TEST_P(GpuCompactionFormats, MatchesHostCompactionByteForByte) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const KvTierFormat& f = GetParam().format;
  auto layout = kernels::ComputePageLayout(f);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const KvPageLayout& l = *layout;
  const uint64_t seed = TestSeed();
  std::cout << "seed " << seed << " (set SLUICE_TEST_SEED to repeat)\n";
  SCOPED_TRACE(testing::Message() << "seed " << seed << ", " << GetParam().name << ", " << l.tokens
                                  << " slots per page, group " << l.token_group);
  std::mt19937_64 rng(seed);
  for (const auto& [lists, max_pages] :
       std::vector<std::pair<int, int>>{{1, 1}, {40, 12}, {700, 5}}) {
    Batch b = RandomBatch(rng, l, f.page_bytes, lists, max_pages);
    auto arena = DeviceArray<uint8_t>::Create(b.arena.size());
    ASSERT_TRUE(arena.ok()) << arena.status();
    ASSERT_EQ(cudaMemcpy(arena->data(), b.arena.data(), b.arena.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    auto compactor =
        GpuCompactor::Create({arena->data(), b.num_pages, static_cast<int64_t>(f.page_bytes)}, f);
    ASSERT_TRUE(compactor.ok()) << compactor.status();
    GpuCompactionResult got;
    const absl::Status s = (*compactor)->Compact({b.offsets, b.ids, b.used}, {}, &got);
    ASSERT_TRUE(s.ok()) << s;
    std::vector<uint8_t> device_after(b.arena.size());
    ASSERT_EQ(
        cudaMemcpy(device_after.data(), arena->data(), b.arena.size(), cudaMemcpyDeviceToHost),
        cudaSuccess);
    std::vector<PageId> device_freed(got.freed.size());
    if (!device_freed.empty()) {
      ASSERT_EQ(cudaMemcpy(device_freed.data(), got.device_freed_ids,
                           device_freed.size() * sizeof(PageId), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    {  // Again from the same pages without moves reported: the same pages and plan.
      ASSERT_EQ(cudaMemcpy(arena->data(), b.arena.data(), b.arena.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      GpuCompactionResult quiet;
      const absl::Status again =
          (*compactor)->Compact({b.offsets, b.ids, b.used}, {.report_moves = false}, &quiet);
      ASSERT_TRUE(again.ok()) << again;
      EXPECT_EQ(quiet.used_after, got.used_after);
      EXPECT_EQ(quiet.freed, got.freed);
      EXPECT_EQ(quiet.moved_slots, got.moved_slots);
      EXPECT_TRUE(quiet.moves.empty());
      std::vector<uint8_t> quiet_after(b.arena.size());
      ASSERT_EQ(
          cudaMemcpy(quiet_after.data(), arena->data(), b.arena.size(), cudaMemcpyDeviceToHost),
          cudaSuccess);
      EXPECT_TRUE(quiet_after == device_after);
    }

    ASSERT_EQ(got.used_after.size(), b.ids.size());
    ASSERT_EQ(got.pages_after.size(), static_cast<size_t>(lists));
    int64_t moved = 0;
    for (int list = 0; list < lists; ++list) {
      SCOPED_TRACE(testing::Message() << "list " << list);
      const int64_t first = b.offsets[list], n = b.offsets[list + 1] - first;
      std::vector<SlotBitmapView> views;
      std::vector<uint64_t*> bitmaps;
      for (int64_t i = 0; i < n; ++i) {
        views.push_back({b.bits(b.ids[first + i], l), b.used[first + i]});
        bitmaps.push_back(b.bits(b.ids[first + i], l));
      }
      auto plan = PlanCompaction(views, l.tokens, l.token_group);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_TRUE(ApplyCompaction(*plan, bitmaps, [&](const SlotMove& m) {
                    HostMove(f, l, b.page(b.ids[first + m.src_page]), m.src_slot,
                             b.page(b.ids[first + m.dst_page]), m.dst_slot, m.slots);
                    moved += m.slots;
                  }).ok());
      EXPECT_THAT(
          std::vector<int32_t>(got.used_after.begin() + first, got.used_after.begin() + first + n),
          ElementsAreArray(plan->used_after));
      EXPECT_EQ(got.pages_after[list], plan->pages_after);
      EXPECT_THAT(std::vector<int32_t>(got.freed.begin() + got.freed_offsets[list],
                                       got.freed.begin() + got.freed_offsets[list + 1]),
                  ElementsAreArray(plan->freed));
      std::vector<PageId> freed_ids;
      for (int32_t i : plan->freed) freed_ids.push_back(b.ids[first + i]);
      EXPECT_THAT(std::vector<PageId>(device_freed.begin() + got.freed_offsets[list],
                                      device_freed.begin() + got.freed_offsets[list + 1]),
                  ElementsAreArray(freed_ids));
      EXPECT_THAT(std::vector<SlotMove>(got.moves.begin() + got.move_offsets[list],
                                        got.moves.begin() + got.move_offsets[list + 1]),
                  ElementsAreArray(plan->moves));
    }
    EXPECT_EQ(got.moved_slots, moved);
    // Every byte of the arena, pages in no list included.
    for (int64_t id = 0; id < b.num_pages; ++id) {
      ASSERT_EQ(std::memcmp(device_after.data() + id * b.page_bytes, b.page(id), b.page_bytes), 0)
          << "page " << id << " differs from the host compaction";
    }
  }
}

// The standalone sparse copy against KvMoveSlot (or whole-group copies): random moves between
// random pages, with each destination slot's valid bit taken from its source.
TEST_P(GpuCompactionFormats, SparseCopyMatchesHostMoves) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const KvTierFormat& f = GetParam().format;
  auto layout = kernels::ComputePageLayout(f);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const KvPageLayout& l = *layout;
  const uint64_t seed = TestSeed();
  std::cout << "seed " << seed << " (set SLUICE_TEST_SEED to repeat)\n";
  SCOPED_TRACE(testing::Message() << "seed " << seed << ", " << GetParam().name);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Batch b = RandomBatch(rng, l, f.page_bytes, 8, 4);
  const int32_t g = l.token_group;
  const int32_t units = l.tokens / g;
  // Destinations first (distinct units), then sources among units no move writes.
  std::vector<std::vector<bool>> written(b.num_pages, std::vector<bool>(units, false));
  std::vector<GpuSlotMove> moves;
  for (int k = 0; k < 200; ++k) {
    const PageId dst = static_cast<PageId>(uniform(0, b.num_pages - 1));
    const int32_t u = static_cast<int32_t>(uniform(0, units - 1));
    int32_t run = static_cast<int32_t>(uniform(1, 3));
    while (run > 0 && (u + run > units)) --run;
    bool free_run = true;
    for (int32_t x = 0; x < run; ++x) free_run = free_run && !written[dst][u + x];
    if (!free_run || run == 0) continue;
    for (int32_t x = 0; x < run; ++x) written[dst][u + x] = true;
    moves.push_back(
        {.src_page = 0, .src_slot = 0, .dst_page = dst, .dst_slot = u * g, .slots = run * g});
  }
  std::vector<GpuSlotMove> kept;
  for (GpuSlotMove& m : moves) {
    const int32_t run = m.slots / g;
    bool found = false;
    for (int tries = 0; tries < 50 && !found; ++tries) {
      const PageId src = static_cast<PageId>(uniform(0, b.num_pages - 1));
      const int32_t u = static_cast<int32_t>(uniform(0, units - run));
      found = true;
      for (int32_t x = 0; x < run; ++x) found = found && !written[src][u + x];
      if (found) {
        m.src_page = src;
        m.src_slot = u * g;
      }
    }
    if (found) kept.push_back(m);
  }
  auto arena = DeviceArray<uint8_t>::Create(b.arena.size());
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_EQ(cudaMemcpy(arena->data(), b.arena.data(), b.arena.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  auto compactor =
      GpuCompactor::Create({arena->data(), b.num_pages, static_cast<int64_t>(f.page_bytes)}, f);
  ASSERT_TRUE(compactor.ok()) << compactor.status();
  const absl::Status s = (*compactor)->SparseCopy(kept);
  ASSERT_TRUE(s.ok()) << s;
  for (const GpuSlotMove& m : kept) {
    HostMove(f, l, b.page(m.src_page), m.src_slot, b.page(m.dst_page), m.dst_slot, m.slots);
    for (int32_t k = 0; k < m.slots; ++k) {
      if (TestSlot(b.bits(m.src_page, l), m.src_slot + k)) {
        SetSlot(b.bits(m.dst_page, l), m.dst_slot + k);
      } else {
        ClearSlot(b.bits(m.dst_page, l), m.dst_slot + k);
      }
    }
  }
  std::vector<uint8_t> device_after(b.arena.size());
  ASSERT_EQ(cudaMemcpy(device_after.data(), arena->data(), b.arena.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int64_t id = 0; id < b.num_pages; ++id) {
    ASSERT_EQ(std::memcmp(device_after.data() + id * b.page_bytes, b.page(id), b.page_bytes), 0)
        << "page " << id << " differs after " << kept.size() << " moves";
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, GpuCompactionFormats, ::testing::ValuesIn(Formats()),
                         [](const auto& info) { return info.param.name; });

TEST(GpuCompaction, EveryTestFormatHasALayout) {
  for (const FormatCase& c : Formats()) {
    EXPECT_TRUE(kernels::ComputePageLayout(c.format).ok()) << c.name;
  }
}

// No device memory is touched by these: a host address stands in for the arena.
uint8_t fake_arena[64];

TEST(GpuCompaction, HuffmanTiersAreUnimplemented) {
  KvTierFormat f{.k = Spec(KvCodec::kInt, 8, KvGrouping::kPerChannel, 32),
                 .v = Spec(KvCodec::kInt, 8),
                 .head_dim = 64,
                 .huffman_bits = 3.f};
  auto c = GpuCompactor::Create({fake_arena, 4, 16 * 1024}, f);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("Huffman"));
}

TEST(GpuCompaction, BadFormatOrArenaIsInvalid) {
  const KvTierFormat good = Formats()[0].format;
  KvTierFormat bad = good;
  bad.head_dim = 48;
  EXPECT_EQ(GpuCompactor::Create({fake_arena, 4, 4096}, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GpuCompactor::Create({nullptr, 4, 4096}, good).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GpuCompactor::Create({fake_arena, 4, 2048}, good).status().code(),
            absl::StatusCode::kInvalidArgument);  // pages smaller than the format's
}

TEST(GpuCompaction, EmptyBatchesNeedNoDevice) {
  auto c = GpuCompactor::Create({fake_arena, 4, 4096}, Formats()[0].format);
  ASSERT_TRUE(c.ok()) << c.status();
  GpuCompactionResult r;
  ASSERT_TRUE((*c)->Compact({}, {}, &r).ok());
  EXPECT_TRUE(r.pages_after.empty());
  EXPECT_THAT(r.freed_offsets, ElementsAreArray({0}));
  const std::vector<int64_t> offsets = {0, 0, 0};
  ASSERT_TRUE((*c)->Compact({offsets, {}, {}}, {}, &r).ok());
  EXPECT_THAT(r.pages_after, ElementsAreArray({0, 0}));
  EXPECT_THAT(r.freed_offsets, ElementsAreArray({0, 0, 0}));
  EXPECT_THAT(r.move_offsets, ElementsAreArray({0, 0, 0}));
  EXPECT_TRUE(r.moves.empty());
  EXPECT_TRUE((*c)->SparseCopy({}).ok());
}

TEST(GpuCompaction, MalformedListsAreRejectedBeforeDeviceWork) {
  auto c = GpuCompactor::Create({fake_arena, 8, 4096}, Formats()[0].format);
  ASSERT_TRUE(c.ok()) << c.status();
  const int32_t slots = (*c)->layout().tokens;
  struct Case {
    const char* what;
    std::vector<int64_t> offsets;
    std::vector<PageId> ids;
    std::vector<int32_t> used;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"offsets not from 0", {1, 2}, {0, 1}, {1, 1}, "from 0"},
      {"offsets short of the pages", {0, 1}, {0, 1}, {1, 1}, "from 0"},
      {"decreasing offsets", {0, 2, 1, 2}, {0, 1}, {1, 1}, "decrease"},
      {"an offset past the pages", {0, 5, 2}, {0, 1}, {1, 1}, "decrease"},
      {"lengths disagree", {0, 2}, {0, 1}, {1}, "used_slots"},
      {"no offsets", {}, {0}, {1}, "no list offsets"},
      {"id out of range", {0, 2}, {0, 8}, {1, 1}, "id 8"},
      {"negative id", {0, 1}, {-1}, {1}, "id -1"},
      {"id listed twice", {0, 1, 2}, {3, 3}, {1, 1}, "listed twice"},
      {"used too large", {0, 1}, {2}, {slots + 1}, "used slots"},
      {"used negative", {0, 1}, {2}, {-1}, "used slots"},
  };
  for (const Case& k : cases) {
    GpuCompactionResult r;
    const absl::Status s = (*c)->Compact({k.offsets, k.ids, k.used}, {}, &r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.what << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(k.message)) << k.what;
  }
}

TEST(GpuCompaction, SparseCopyRejectsConflictsBeforeDeviceWork) {
  auto c = GpuCompactor::Create({fake_arena, 8, 4096}, Formats()[0].format);
  ASSERT_TRUE(c.ok()) << c.status();
  const int32_t slots = (*c)->layout().tokens;
  auto check = [&](std::vector<GpuSlotMove> moves, const char* message) {
    const absl::Status s = (*c)->SparseCopy(moves);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(message));
  };
  check({{.src_page = 0, .src_slot = 0, .dst_page = 1, .dst_slot = 0, .slots = 2},
         {.src_page = 2, .src_slot = 0, .dst_page = 1, .dst_slot = 1, .slots = 1}},
        "more than one move");
  check({{.src_page = 0, .src_slot = 0, .dst_page = 1, .dst_slot = 0, .slots = 1},
         {.src_page = 1, .src_slot = 0, .dst_page = 2, .dst_slot = 0, .slots = 1}},
        "which a move writes");
  check({{.src_page = 0, .src_slot = 0, .dst_page = 0, .dst_slot = 1, .slots = 2}},
        "which a move writes");  // overlapping ranges within a page
  check({{.src_page = 0, .src_slot = slots - 1, .dst_page = 1, .dst_slot = 0, .slots = 2}},
        "outside");
  check({{.src_page = 8, .src_slot = 0, .dst_page = 1, .dst_slot = 0, .slots = 1}}, "outside");

  const FormatCase grouped = Formats()[4];  // K per channel, token group 16
  auto g = GpuCompactor::Create({fake_arena, 8, 4096}, grouped.format);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ((*g)->layout().token_group, 16);
  const absl::Status s = (*g)->SparseCopy(std::vector<GpuSlotMove>{
      {.src_page = 0, .src_slot = 16, .dst_page = 1, .dst_slot = 8, .slots = 16}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("splits a group"));
}

}  // namespace
}  // namespace sluice::kvstore::cuda
