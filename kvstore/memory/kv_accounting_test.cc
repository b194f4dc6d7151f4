// KV accounting: the derived ratios, their zero cases, and sums.
#include "kvstore/memory/kv_accounting.h"

#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

TEST(KvAccounting, EmptyHasNoFragmentationAndNoRatio) {
  const KvAccounting a;
  EXPECT_EQ(a.pages(), 0);
  EXPECT_EQ(a.bytes(), 0);
  EXPECT_EQ(a.fragmentation(), 0.0);
  EXPECT_EQ(a.compression_ratio(), 0.0);
}

TEST(KvAccounting, RatiosAndSums) {
  // 2 high-tier pages of 64 slots, 1 low-tier page of 256 slots, 16 KiB each; 300 live tokens
  // of head_dim 128.
  KvAccounting a = {.pages_high = 2,
                    .pages_low = 1,
                    .page_bytes = 16384,
                    .live_slots = 300,
                    .allocated_slots = 2 * 64 + 256,
                    .fp16_bytes = Fp16KvBytes(300, 128)};
  EXPECT_EQ(a.pages(), 3);
  EXPECT_EQ(a.bytes(), 3 * 16384);
  EXPECT_EQ(a.fp16_bytes, 300 * 128 * 2 * 2);
  EXPECT_DOUBLE_EQ(a.fragmentation(), 1.0 - 300.0 / 384.0);
  EXPECT_DOUBLE_EQ(a.compression_ratio(), 153600.0 / 49152.0);
  EXPECT_EQ(a.ToString(),
            "pages 2 high + 1 low (49152 bytes), 300 of 384 slots live (fragmentation 0.219), "
            "3.12x smaller than fp16");

  KvAccounting total;  // no page size yet: takes the first one it is given
  total += a;
  total += a;
  EXPECT_EQ(total.page_bytes, 16384);
  EXPECT_EQ(total.pages_high, 4);
  EXPECT_EQ(total.pages_low, 2);
  EXPECT_EQ(total.live_slots, 600);
  EXPECT_EQ(total.allocated_slots, 768);
  EXPECT_EQ(total.fp16_bytes, 2 * a.fp16_bytes);
  // Sums keep the ratios of equal parts.
  EXPECT_DOUBLE_EQ(total.fragmentation(), a.fragmentation());
  EXPECT_DOUBLE_EQ(total.compression_ratio(), a.compression_ratio());
  EXPECT_EQ(a + a, total);
  EXPECT_EQ(KvAccounting{} + a, a);

  // Fully packed pages have no fragmentation.
  KvAccounting packed = a;
  packed.live_slots = packed.allocated_slots;
  EXPECT_EQ(packed.fragmentation(), 0.0);
}

}  // namespace
}  // namespace sluice::kvstore
