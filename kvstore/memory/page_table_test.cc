// Bidirectional page tables against a two-vector model (growth keeps both sides), and the
// page -> owner map.
#include "kvstore/memory/page_table.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BidirectionalPageTable, TiersGrowFromBothEnds) {
  BidirectionalPageTable table(6);
  ASSERT_TRUE(table.PushHigh(10).ok());
  ASSERT_TRUE(table.PushHigh(11).ok());
  ASSERT_TRUE(table.PushLow(20).ok());
  ASSERT_TRUE(table.PushLow(21).ok());
  ASSERT_TRUE(table.PushLow(22).ok());
  EXPECT_EQ(table.capacity(), 6);
  EXPECT_THAT(std::vector<PageId>(table.data(), table.data() + 6),
              ElementsAre(10, 11, kNoPage, 22, 21, 20));
  EXPECT_EQ(table.high(1), 11);
  EXPECT_EQ(table.low(0), 20);
  EXPECT_EQ(table.low(2), 22);
  EXPECT_EQ(table.high(2), kNoPage);
  EXPECT_EQ(table.low(-1), kNoPage);
  EXPECT_THAT(table.AllPages(), ElementsAre(10, 11, 20, 21, 22));

  // The sixth page fills the array; the seventh doubles it with both sides intact.
  ASSERT_TRUE(table.PushHigh(12).ok());
  EXPECT_EQ(table.capacity(), 6);
  ASSERT_TRUE(table.PushLow(23).ok());
  EXPECT_EQ(table.capacity(), 12);
  EXPECT_THAT(std::vector<PageId>(table.data(), table.data() + 12),
              ElementsAre(10, 11, 12, kNoPage, kNoPage, kNoPage, kNoPage, kNoPage, 23, 22, 21, 20));

  ASSERT_TRUE(table.EraseLow(1).ok());   // 21
  ASSERT_TRUE(table.EraseHigh(0).ok());  // 10
  EXPECT_THAT(table.AllPages(), ElementsAre(11, 12, 20, 22, 23));
  EXPECT_EQ(*table.PopLow(), 23);
  EXPECT_EQ(*table.PopHigh(), 12);
  EXPECT_THAT(table.AllPages(), ElementsAre(11, 20, 22));
  EXPECT_THAT(std::vector<PageId>(table.data(), table.data() + 12),
              ElementsAre(11, kNoPage, kNoPage, kNoPage, kNoPage, kNoPage, kNoPage, kNoPage,
                          kNoPage, kNoPage, 22, 20));

  table.Clear();
  EXPECT_EQ(table.high_count(), 0);
  EXPECT_EQ(table.low_count(), 0);
  EXPECT_EQ(table.capacity(), 12);
  EXPECT_TRUE(table.AllPages().empty());
}

TEST(BidirectionalPageTable, Errors) {
  BidirectionalPageTable table;
  EXPECT_EQ(table.capacity(), 0);
  EXPECT_EQ(table.PopHigh().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(table.PopLow().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(table.PushHigh(kNoPage).message(), HasSubstr("page -1"));
  EXPECT_EQ(table.PushLow(-5).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(table.PushLow(3).ok());
  EXPECT_EQ(table.capacity(), 4);
  const absl::Status st = table.EraseLow(1);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(), HasSubstr("EraseLow(1): the table holds 1 low-tier pages"));
  EXPECT_EQ(table.EraseHigh(0).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(table.EraseLow(-1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(table.AllPages(), ElementsAre(3));
  EXPECT_EQ(table.ReplaceHigh(0, 7).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(table.PushHigh(8).ok());
  EXPECT_EQ(table.ReplaceHigh(0, -2).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(table.ReplaceHigh(0, 9).ok());
  EXPECT_THAT(table.AllPages(), ElementsAre(9, 3));
  EXPECT_EQ(table.ReplaceLow(1, 7).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(table.ReplaceLow(0, -1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(table.ReplaceLow(0, 4).ok());
  EXPECT_THAT(table.AllPages(), ElementsAre(9, 4));
  EXPECT_EQ(table.low(0), 4);
  BidirectionalPageTable negative(-4);
  EXPECT_EQ(negative.capacity(), 0);
}

// Random operations against two vectors; after each, every accessor and the raw layout agree.
TEST(BidirectionalPageTable, RandomOperationsMatchModel) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int32_t initial : {0, 1, 5, 64}) {
    SCOPED_TRACE(initial);
    BidirectionalPageTable table(initial);
    std::vector<PageId> high, low;
    PageId next = 0;
    int32_t max_capacity = 0;
    for (int step = 0; step < 3000; ++step) {
      const int op = std::uniform_int_distribution<int>(0, 99)(rng);
      auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
      if (op < 30) {
        ASSERT_TRUE(table.PushHigh(next).ok());
        high.push_back(next++);
      } else if (op < 60) {
        ASSERT_TRUE(table.PushLow(next).ok());
        low.push_back(next++);
      } else if (op < 70 && !high.empty()) {
        const size_t i = pick(high.size());
        ASSERT_TRUE(table.EraseHigh(static_cast<int32_t>(i)).ok());
        high.erase(high.begin() + i);
      } else if (op < 80 && !low.empty()) {
        const size_t i = pick(low.size());
        ASSERT_TRUE(table.EraseLow(static_cast<int32_t>(i)).ok());
        low.erase(low.begin() + i);
      } else if (op < 87 && !high.empty()) {
        ASSERT_EQ(*table.PopHigh(), high.back());
        high.pop_back();
      } else if (op < 94 && !low.empty()) {
        ASSERT_EQ(*table.PopLow(), low.back());
        low.pop_back();
      } else if (op < 97) {
        const int32_t cap = table.capacity() + static_cast<int32_t>(pick(8));
        table.Reserve(cap);
        ASSERT_GE(table.capacity(), cap);
      } else if (op < 98) {
        table.Clear();
        high.clear();
        low.clear();
      }
      ASSERT_EQ(table.high_count(), static_cast<int32_t>(high.size()));
      ASSERT_EQ(table.low_count(), static_cast<int32_t>(low.size()));
      const int32_t cap = table.capacity();
      ASSERT_GE(cap, table.high_count() + table.low_count());
      max_capacity = std::max(max_capacity, cap);
      for (size_t i = 0; i < high.size(); ++i) {
        ASSERT_EQ(table.high(static_cast<int32_t>(i)), high[i]);
        ASSERT_EQ(table.data()[i], high[i]);
      }
      for (size_t i = 0; i < low.size(); ++i) {
        ASSERT_EQ(table.low(static_cast<int32_t>(i)), low[i]);
        ASSERT_EQ(table.data()[cap - 1 - i], low[i]);
      }
      for (int32_t k = table.high_count(); k < cap - table.low_count(); ++k) {
        ASSERT_EQ(table.data()[k], kNoPage) << "gap entry " << k;
      }
      std::vector<PageId> all = high;
      all.insert(all.end(), low.begin(), low.end());
      ASSERT_EQ(table.AllPages(), all);
    }
    EXPECT_GT(max_capacity, initial) << "the table never grew";
  }
}

}  // namespace
}  // namespace sluice::kvstore
