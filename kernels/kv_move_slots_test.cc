// KvMoveSlots on every backend against KvMoveSlot (kernels/kv_format.h), the scalar reference:
// fixed-width tiers with K grouped per token, tiled and not, with and without token metadata.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kv_format.h"
#include "kernels/test_util/op_test.h"
#include "kernels/test_util/slot_move_formats.h"

namespace sluice::kernels {
namespace {

class KvMoveSlotsTest : public testing::OpTest<Op::kKvMoveSlots> {};

TEST_P(KvMoveSlotsTest, MatchesKvMoveSlot) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const std::vector<KvTierFormat> formats = testing::SlotMoveFormats();
  for (const KvTierFormat& f : formats) {
    SCOPED_TRACE(::testing::Message() << KvTierFormatName(f) << " seed=" << seed);
    auto layout = ComputePageLayout(f);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const int64_t pages = 4, page_bytes = f.page_bytes, n = layout->tokens;
    std::vector<uint8_t> pool(pages * page_bytes);
    for (auto& b : pool) b = static_cast<uint8_t>(rng());
    // Sources in pages 2 and 3, destinations in pages 0 and 1: random disjoint runs.
    std::vector<KvSlotMove> moves;
    std::vector<int32_t> dst_free(2 * n);
    std::iota(dst_free.begin(), dst_free.end(), 0);
    std::shuffle(dst_free.begin(), dst_free.end(), rng);
    for (int i = 0; i < 12; ++i) {
      const int32_t d = dst_free[i];
      const int32_t slots = 1 + static_cast<int32_t>(rng() % 3);
      const int32_t dst_slot = std::min<int32_t>(d % n, n - slots);
      moves.push_back({.src_page = 2 + static_cast<int32_t>(rng() % 2),
                       .src_slot = static_cast<int32_t>(rng() % (n - slots + 1)),
                       .dst_page = d / n,
                       .dst_slot = dst_slot,
                       .slots = slots});
    }
    // Drop moves whose destinations overlap an earlier one's.
    std::vector<std::vector<bool>> taken(2, std::vector<bool>(n, false));
    std::vector<KvSlotMove> kept;
    for (const KvSlotMove& m : moves) {
      bool clash = false;
      for (int32_t k = 0; k < m.slots; ++k) clash |= taken[m.dst_page][m.dst_slot + k];
      if (clash) continue;
      for (int32_t k = 0; k < m.slots; ++k) taken[m.dst_page][m.dst_slot + k] = true;
      kept.push_back(m);
    }
    std::vector<uint8_t> want = pool;
    for (const KvSlotMove& m : kept) {
      for (int32_t k = 0; k < m.slots; ++k) {
        KvMoveSlot(f, *layout, &want[m.src_page * page_bytes], m.src_slot + k,
                   &want[m.dst_page * page_bytes], m.dst_slot + k);
      }
    }
    // The valid bit moves with the slot: KvMoveSlot sets it, the source's bit decides on the
    // device; make every source slot valid so the two agree.
    for (const int64_t p : {2, 3}) {
      for (int64_t w = 0; w < (n + 63) / 64; ++w) {
        uint64_t all = ~uint64_t{0};
        std::memcpy(&pool[p * page_bytes + layout->valid + w * 8], &all, 8);
        std::memcpy(&want[p * page_bytes + layout->valid + w * 8], &all, 8);
      }
    }
    auto device = backend_->Allocate(pool.size());
    ASSERT_TRUE(device.ok());
    uint8_t* d = static_cast<uint8_t*>(*device);
    const BufferView<uint8_t> pool_view{
        .data = d, .size = pages * page_bytes, .space = backend_->memory_space()};
    ASSERT_TRUE(backend_->CopyToDevice(d, pool.data(), pool.size()).ok());
    const absl::Status st = backend_->KvMoveSlots({.format = f,
                                                   .layout = *layout,
                                                   .pool = pool_view,
                                                   .pages = pages,
                                                   .page_bytes = page_bytes,
                                                   .moves = kept.data(),
                                                   .count = static_cast<int64_t>(kept.size())});
    ASSERT_TRUE(st.ok()) << st;
    std::vector<uint8_t> got(pool.size());
    ASSERT_TRUE(backend_->CopyToHost(got.data(), d, got.size()).ok());
    backend_->Free(d);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "byte " << i % page_bytes << " of page " << i / page_bytes;
    }
    // A pool view shorter than its pages, or in other memory, is refused before anything runs.
    BufferView<uint8_t> short_pool = pool_view;
    short_pool.size -= 1;
    BufferView<uint8_t> elsewhere = pool_view;
    elsewhere.space =
        pool_view.space == MemorySpace::kHost ? MemorySpace::kDevice : MemorySpace::kHost;
    for (const BufferView<uint8_t>& bad_pool : {short_pool, elsewhere}) {
      EXPECT_EQ(backend_
                    ->KvMoveSlots({.format = f,
                                   .layout = *layout,
                                   .pool = bad_pool,
                                   .pages = pages,
                                   .page_bytes = page_bytes,
                                   .moves = kept.data(),
                                   .count = static_cast<int64_t>(kept.size())})
                    .code(),
                absl::StatusCode::kInvalidArgument);
    }
    // A move outside the pool is refused before anything runs.
    KvSlotMove bad = kept[0];
    bad.dst_slot = static_cast<int32_t>(n);
    EXPECT_EQ(backend_
                  ->KvMoveSlots({.format = f,
                                 .layout = *layout,
                                 .pool = pool_view,
                                 .pages = pages,
                                 .page_bytes = page_bytes,
                                 .moves = &bad,
                                 .count = 1})
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
}

SLUICE_INSTANTIATE_OP_TEST(KvMoveSlotsTest);

}  // namespace
}  // namespace sluice::kernels
