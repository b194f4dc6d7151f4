// The compactor every backend gets (CreateCompactor) against the scalar reference: PlanCompaction
// and ApplyCompaction on host bitmaps with KvMoveSlot copies on a host copy of the pool. Fresh
// random pools, evictions and list lengths; the plans, the host bitmaps and every byte of the
// pages that stay must agree.
#include "kvstore/memory/compactor.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device_buffer.h"
#include "kernels/kv_format.h"
#include "kernels/test_util/op_test.h"
#include "kernels/test_util/slot_move_formats.h"
#include "kvstore/memory/slot_bitmap.h"

namespace sluice::kvstore {
namespace {

using kernels::KvCodec;
using kernels::KvGrouping;
using kernels::KvPageLayout;
using kernels::KvQuantSpec;
using kernels::KvTierFormat;
using kernels::Op;

class CompactorTest : public kernels::testing::OpTest<Op::kKvMoveSlots> {};

constexpr auto Int = kernels::testing::IntPerToken;

uint64_t* BitsOf(std::vector<uint8_t>& pool, int64_t page_bytes, const KvPageLayout& layout,
                 PageId id) {
  return reinterpret_cast<uint64_t*>(&pool[id * page_bytes + layout.valid]);
}

TEST_P(CompactorTest, PlansAndMovesAsTheHostReference) {
  const uint64_t seed = kernels::testing::TestSeed();
  std::mt19937_64 rng(seed);
  const std::vector<KvTierFormat> formats = kernels::testing::SlotMoveFormats();
  for (const KvTierFormat& f : formats) {
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    auto layout = ComputePageLayout(f);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const int32_t n = layout->tokens;
    const int64_t pages = 40, page_bytes = f.page_bytes;
    const int64_t words = SlotBitmapWords(n);

    // Random page bytes; lists of 1 to 7 pages in a shuffled order of the pool, full pages but
    // for each list's last, a random half of the slots evicted (some pages wholly).
    std::vector<uint8_t> pool(pages * page_bytes);
    for (auto& b : pool) b = static_cast<uint8_t>(rng());
    std::vector<PageId> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    struct List {
      std::vector<PageId> pages;
      std::vector<int32_t> used;
    };
    std::vector<List> lists;
    for (size_t next = 0; next + 1 < order.size() && lists.size() < 6;) {
      const size_t len = std::min<size_t>(1 + rng() % 7, order.size() - next - 1);
      List list;
      for (size_t i = 0; i < len; ++i) {
        const PageId id = order[next++];
        const int32_t used = i + 1 < len ? n : static_cast<int32_t>(1 + rng() % n);
        const int mode = static_cast<int>(rng() % 4);  // 0: all dead, 1: all live, else random
        uint64_t* bits = BitsOf(pool, page_bytes, *layout, id);
        std::fill(bits, bits + words, 0);
        for (int32_t s = 0; s < used; ++s) {
          if (mode == 1 || (mode > 1 && rng() % 2 == 0)) bits[s / 64] |= uint64_t{1} << (s % 64);
        }
        list.pages.push_back(id);
        list.used.push_back(used);
      }
      lists.push_back(std::move(list));
    }

    // The reference, on a host copy.
    std::vector<uint8_t> want = pool;
    std::vector<CompactionPlan> want_plans;
    for (const List& list : lists) {
      std::vector<SlotBitmapView> views;
      std::vector<uint64_t*> bitmaps;
      for (size_t i = 0; i < list.pages.size(); ++i) {
        bitmaps.push_back(BitsOf(want, page_bytes, *layout, list.pages[i]));
        views.push_back({.words = bitmaps.back(), .used_slots = list.used[i]});
      }
      auto plan = PlanCompaction(views, n);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_TRUE(ApplyCompaction(*plan, bitmaps, [&](const SlotMove& m) {
                    for (int32_t k = 0; k < m.slots; ++k) {
                      kernels::KvMoveSlot(
                          f, *layout, &want[list.pages[m.src_page] * page_bytes], m.src_slot + k,
                          &want[list.pages[m.dst_page] * page_bytes], m.dst_slot + k);
                    }
                  }).ok());
      want_plans.push_back(*std::move(plan));
    }

    // The backend's compactor, with the host's bitmaps kept apart from the pages as a device
    // pool keeps them.
    auto memory = kernels::DeviceBuffer::Create(*backend_, pool.size());
    ASSERT_TRUE(memory.ok()) << memory.status();
    ASSERT_TRUE(memory->Upload(pool.data(), pool.size()).ok());
    auto compactor =
        CreateCompactor(*backend_, f, *layout,
                        {.base = memory->as<uint8_t>(), .pages = pages, .page_bytes = page_bytes});
    ASSERT_TRUE(compactor.ok()) << compactor.status();
    EXPECT_EQ((*compactor)->planner(),
              backend_->kind() == kernels::BackendKind::kCuda ? "cuda" : "host");
    std::vector<std::vector<uint64_t>> host_bits(pages);
    std::vector<std::vector<uint64_t*>> bitmaps(lists.size());
    std::vector<CompactionList> requests;
    for (size_t l = 0; l < lists.size(); ++l) {
      for (const PageId id : lists[l].pages) {
        const uint64_t* bits = BitsOf(pool, page_bytes, *layout, id);
        host_bits[id].assign(bits, bits + words);
        bitmaps[l].push_back(host_bits[id].data());
      }
      requests.push_back({lists[l].pages, bitmaps[l], lists[l].used});
    }
    std::vector<CompactionPlan> plans;
    const absl::Status st = (*compactor)->Compact(requests, &plans);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(plans.size(), lists.size());

    std::vector<uint8_t> got(pool.size());
    ASSERT_TRUE(memory->Download(got.data(), got.size()).ok());
    std::vector<bool> freed(pages, false);
    for (size_t l = 0; l < lists.size(); ++l) {
      SCOPED_TRACE(::testing::Message() << "list " << l);
      const CompactionPlan& p = plans[l];
      const CompactionPlan& w = want_plans[l];
      EXPECT_EQ(p.moves, w.moves);
      EXPECT_EQ(p.freed, w.freed);
      EXPECT_EQ(p.used_before, w.used_before);
      EXPECT_EQ(p.used_after, w.used_after);
      EXPECT_EQ(p.pages_after, w.pages_after);
      for (const int32_t i : w.freed) freed[lists[l].pages[i]] = true;
      for (const PageId id : lists[l].pages) {
        EXPECT_TRUE(std::equal(host_bits[id].begin(), host_bits[id].end(),
                               BitsOf(want, page_bytes, *layout, id)))
            << "host bitmap of page " << id;
        // Unless the compactor moved the pages' own bits, the caller writes its bitmaps back.
        if (!(*compactor)->moves_page_bits()) {
          std::memcpy(BitsOf(got, page_bytes, *layout, id), host_bits[id].data(), words * 8);
        }
      }
    }
    // Every page that stays, listed or not, holds the reference's bytes.
    for (PageId id = 0; id < pages; ++id) {
      if (freed[id]) continue;
      for (int64_t b = 0; b < page_bytes; ++b) {
        ASSERT_EQ(got[id * page_bytes + b], want[id * page_bytes + b])
            << "byte " << b << " of page " << id;
      }
    }

    // A list whose lengths disagree is refused before anything changes.
    CompactionList bad = requests[0];
    bad.used_slots = bad.used_slots.subspan(1);
    EXPECT_EQ((*compactor)->Compact({&bad, 1}, &plans).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST_P(CompactorTest, TiersWhoseSlotsCannotMoveAloneAreRefused) {
  const KvTierFormat kivi{
      .k = {.codec = KvCodec::kInt, .bits = 2, .grouping = KvGrouping::kPerChannel, .group = 32},
      .v = Int(2, 32),
      .head_dim = 64,
      .page_bytes = 4096};
  KvTierFormat huffman{.k = Int(8, 0), .v = Int(8, 0), .head_dim = 64, .page_bytes = 4096};
  huffman.huffman_bits = 3.f;
  auto memory = kernels::DeviceBuffer::Create(*backend_, 8 * 4096);
  ASSERT_TRUE(memory.ok());
  for (const KvTierFormat& f : {kivi, huffman}) {
    auto layout = ComputePageLayout(f);
    ASSERT_TRUE(layout.ok()) << layout.status();
    auto compactor = CreateCompactor(
        *backend_, f, *layout, {.base = memory->as<uint8_t>(), .pages = 8, .page_bytes = 4096});
    EXPECT_EQ(compactor.status().code(), absl::StatusCode::kInvalidArgument) << KvTierFormatName(f);
  }
}

SLUICE_INSTANTIATE_OP_TEST(CompactorTest);

}  // namespace
}  // namespace sluice::kvstore
