// Slot bitmaps against a std::vector<bool> model, with garbage bits past the last slot.
#include "kvstore/memory/slot_bitmap.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

TEST(SlotBitmap, Words) {
  EXPECT_EQ(SlotBitmapWords(-1), 0);
  EXPECT_EQ(SlotBitmapWords(0), 0);
  EXPECT_EQ(SlotBitmapWords(1), 1);
  EXPECT_EQ(SlotBitmapWords(64), 1);
  EXPECT_EQ(SlotBitmapWords(65), 2);
  EXPECT_EQ(SlotBitmapWords(1024), 16);
}

TEST(SlotBitmap, SetClearTest) {
  std::vector<uint64_t> words(2, 0);
  SetSlot(words.data(), 0);
  SetSlot(words.data(), 63);
  SetSlot(words.data(), 64);
  SetSlot(words.data(), 64);
  EXPECT_EQ(words[0], 0x8000000000000001ull);
  EXPECT_EQ(words[1], 1u);
  EXPECT_TRUE(TestSlot(words.data(), 63));
  EXPECT_FALSE(TestSlot(words.data(), 62));
  ClearSlot(words.data(), 63);
  ClearSlot(words.data(), 5);
  EXPECT_EQ(words[0], 1u);
  EXPECT_EQ(CountValid(words.data(), 128), 2);
  EXPECT_EQ(CountValid(words.data(), 64), 1);
  EXPECT_EQ(CountValid(words.data(), 0), 0);
  EXPECT_EQ(FindFirstSet(words.data(), 128, 1), 64);
  EXPECT_EQ(FindFirstClear(words.data(), 128), 1);
}

TEST(SlotBitmap, RandomBitmapsMatchModel) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int64_t slots : {1, 2, 63, 64, 65, 127, 128, 129, 200, 1000}) {
    for (double density : {0.0, 0.02, 0.5, 0.98, 1.0}) {
      SCOPED_TRACE(testing::Message() << "slots " << slots << " density " << density);
      std::vector<bool> model(slots);
      // Garbage everywhere, then every real slot set or cleared through the API.
      std::vector<uint64_t> words(SlotBitmapWords(slots));
      for (uint64_t& w : words) w = rng();
      std::bernoulli_distribution valid(density);
      for (int64_t s = 0; s < slots; ++s) {
        model[s] = valid(rng);
        if (model[s]) {
          SetSlot(words.data(), s);
        } else {
          ClearSlot(words.data(), s);
        }
      }
      int64_t count = 0;
      for (int64_t s = 0; s < slots; ++s) {
        ASSERT_EQ(TestSlot(words.data(), s), model[s]) << s;
        count += model[s];
      }
      ASSERT_EQ(CountValid(words.data(), slots), count);
      for (int64_t from = -2; from <= slots + 1; ++from) {
        int64_t want_set = -1, want_clear = -1;
        for (int64_t s = std::max<int64_t>(from, 0); s < slots; ++s) {
          if (model[s] && want_set < 0) want_set = s;
          if (!model[s] && want_clear < 0) want_clear = s;
        }
        ASSERT_EQ(FindFirstSet(words.data(), slots, from), want_set) << "from " << from;
        ASSERT_EQ(FindFirstClear(words.data(), slots, from), want_clear) << "from " << from;
      }
      // A shorter view of the same words ignores everything past its end.
      const int64_t prefix = slots / 2;
      int64_t prefix_count = 0;
      for (int64_t s = 0; s < prefix; ++s) prefix_count += model[s];
      ASSERT_EQ(CountValid(words.data(), prefix), prefix_count);
    }
  }
}

}  // namespace
}  // namespace sluice::kvstore
