// Compaction plans: hand-checked small cases, argument errors, and random page lists whose
// plans are applied to a fake page array of token ids and checked for lost, duplicated or
// overwritten tokens, page count, untouched full pages and whole-group moves.
#include "kvstore/memory/compaction.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A page list: one bitmap (with words for the whole page) and used_slots per page.
struct Pages {
  Pages(int32_t n, int32_t slots_per_page)
      : words(n, std::vector<uint64_t>(SlotBitmapWords(slots_per_page), 0)), used(n, 0) {}

  // Page p: used_slots and the valid slots (characters '1' of `bits`, slot 0 first).
  void Set(int32_t p, const char* bits, int32_t used_slots) {
    used[p] = used_slots;
    for (int32_t s = 0; bits[s] != '\0'; ++s) {
      if (bits[s] == '1') SetSlot(words[p].data(), s);
    }
  }
  std::vector<SlotBitmapView> Views() const {
    std::vector<SlotBitmapView> views;
    for (size_t p = 0; p < words.size(); ++p) views.push_back({words[p].data(), used[p]});
    return views;
  }
  std::vector<uint64_t*> Bitmaps() {
    std::vector<uint64_t*> bitmaps;
    for (auto& w : words) bitmaps.push_back(w.data());
    return bitmaps;
  }

  std::vector<std::vector<uint64_t>> words;
  std::vector<int32_t> used;
};

TEST(Compaction, MovesTailIntoHolesOfKeptPages) {
  Pages pages(4, 4);
  pages.Set(0, "1111", 4);  // full: untouched
  pages.Set(1, "1010", 4);
  pages.Set(2, "01", 2);
  pages.Set(3, "", 0);
  auto plan = PlanCompaction(pages.Views(), 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pages_after, 2);
  EXPECT_THAT(plan->moves,
              ElementsAre(SlotMove{
                  .src_page = 2, .src_slot = 1, .dst_page = 1, .dst_slot = 1, .slots = 1}));
  EXPECT_THAT(plan->freed, ElementsAre(2, 3));
  EXPECT_THAT(plan->used_before, ElementsAre(4, 4, 2, 0));
  EXPECT_THAT(plan->used_after, ElementsAre(4, 4, 0, 0));
  EXPECT_THAT(FindEmptyPages(pages.Views()), ElementsAre(3));
}

TEST(Compaction, KeepsTheFullestPagesAndCoalescesRuns) {
  Pages pages(2, 8);
  pages.Set(0, "11", 2);
  pages.Set(1, "111", 3);
  auto plan = PlanCompaction(pages.Views(), 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pages_after, 1);
  // Page 1 holds more, so page 0's two tokens move, as one run, past page 1's used slots.
  EXPECT_THAT(plan->moves,
              ElementsAre(SlotMove{
                  .src_page = 0, .src_slot = 0, .dst_page = 1, .dst_slot = 3, .slots = 2}));
  EXPECT_THAT(plan->freed, ElementsAre(0));
  EXPECT_THAT(plan->used_after, ElementsAre(0, 5));
}

TEST(Compaction, GroupsMoveWhole) {
  Pages pages(2, 8);
  pages.Set(0, "01000000", 8);  // group 0 live, group 1 empty
  pages.Set(1, "00001001", 6);  // group 1 live; slot 7 is a stale bit past used_slots
  auto plan = PlanCompaction(pages.Views(), 8, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pages_after, 1);
  EXPECT_THAT(plan->moves,
              ElementsAre(SlotMove{
                  .src_page = 1, .src_slot = 4, .dst_page = 0, .dst_slot = 4, .slots = 4}));
  std::vector<uint64_t*> bitmaps = pages.Bitmaps();
  int copies = 0;
  ASSERT_TRUE(ApplyCompaction(*plan, bitmaps, [&](const SlotMove&) { ++copies; }).ok());
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(pages.words[0][0], 0b00010010u);  // slot 1 kept, slot 4 moved in, stale 7 dropped
  EXPECT_EQ(pages.words[1][0], 0u);
}

TEST(Compaction, NothingLiveFreesEverything) {
  Pages pages(3, 16);
  pages.Set(0, "0000", 4);
  pages.Set(2, "00000000", 16);
  auto plan = PlanCompaction(pages.Views(), 16);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->pages_after, 0);
  EXPECT_THAT(plan->moves, IsEmpty());
  EXPECT_THAT(plan->freed, ElementsAre(0, 1, 2));
  EXPECT_THAT(FindEmptyPages(pages.Views()), ElementsAre(0, 1, 2));
  auto none = PlanCompaction({}, 16);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->pages_after, 0);
}

TEST(Compaction, RejectsBadArguments) {
  Pages pages(2, 8);
  pages.Set(0, "1", 1);
  EXPECT_THAT(PlanCompaction(pages.Views(), 0).status().message(), HasSubstr("slots_per_page"));
  EXPECT_THAT(PlanCompaction(pages.Views(), 8, 3).status().message(),
              HasSubstr("group 3 must be positive and divide the 8 slots"));
  EXPECT_EQ(PlanCompaction(pages.Views(), 8, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  pages.used[1] = 9;
  EXPECT_THAT(PlanCompaction(pages.Views(), 8).status().message(),
              HasSubstr("page 1 of the list has 9 used slots; a page has 8"));
  std::vector<SlotBitmapView> views = {{nullptr, 3}};
  EXPECT_THAT(PlanCompaction(views, 8).status().message(), HasSubstr("no bitmap"));

  pages.used[1] = 0;
  auto plan = PlanCompaction(pages.Views(), 8);
  ASSERT_TRUE(plan.ok());
  auto noop = [](const SlotMove&) {};
  std::vector<uint64_t*> bitmaps = pages.Bitmaps();
  EXPECT_THAT(ApplyCompaction(*plan, absl::MakeSpan(bitmaps).subspan(0, 1), noop).message(),
              HasSubstr("covers 2 pages"));
  std::vector<uint64_t*> with_null = {bitmaps[0], nullptr};
  EXPECT_THAT(ApplyCompaction(*plan, with_null, noop).message(), HasSubstr("page 1"));
  CompactionPlan bad = *plan;
  bad.moves.push_back({.src_page = 1, .src_slot = 0, .dst_page = 2, .dst_slot = 0, .slots = 1});
  int copies = 0;
  EXPECT_THAT(ApplyCompaction(bad, bitmaps, [&](const SlotMove&) { ++copies; }).message(),
              HasSubstr("does not fit"));
  EXPECT_EQ(copies, 0);
}

// Random lists applied to fake pages whose slots hold token ids page * slots_per_page + slot.
TEST(Compaction, RandomListsKeepEveryLiveToken) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  struct Shape {
    int32_t slots_per_page, group;
  };
  for (const Shape shape : {Shape{1, 1}, Shape{7, 1}, Shape{64, 1}, Shape{100, 1}, Shape{128, 32},
                            Shape{96, 16}, Shape{12, 4}, Shape{8, 8}}) {
    const int32_t spp = shape.slots_per_page;
    const int32_t group = shape.group;
    const int32_t units = spp / group;
    for (int trial = 0; trial < 200; ++trial) {
      SCOPED_TRACE(testing::Message()
                   << "slots_per_page " << spp << " group " << group << " trial " << trial);
      const int32_t n = std::uniform_int_distribution<int32_t>(0, 12)(rng);
      Pages pages(n, spp);
      std::vector<std::vector<bool>> valid(n, std::vector<bool>(spp, false));  // the model
      std::vector<std::vector<int64_t>> tokens(n, std::vector<int64_t>(spp));
      std::multiset<int64_t> live_tokens;
      std::vector<int64_t> live_units(n, 0);
      for (int32_t p = 0; p < n; ++p) {
        const int kind = std::uniform_int_distribution<int>(0, 4)(rng);
        pages.used[p] = kind == 0 ? spp : std::uniform_int_distribution<int32_t>(0, spp)(rng);
        const double density = kind == 0 ? 1.0 : std::uniform_real_distribution<double>(0, 1)(rng);
        for (uint64_t& w : pages.words[p]) w = rng();  // stale bits everywhere
        for (int32_t s = 0; s < spp; ++s) {
          tokens[p][s] = int64_t{p} * spp + s;
          if (s >= pages.used[p]) continue;
          valid[p][s] = std::bernoulli_distribution(density)(rng);
          if (valid[p][s]) {
            SetSlot(pages.words[p].data(), s);
            live_tokens.insert(tokens[p][s]);
          } else {
            ClearSlot(pages.words[p].data(), s);
          }
        }
        for (int32_t u = 0; u < units; ++u) {
          live_units[p] +=
              std::any_of(valid[p].begin() + u * group, valid[p].begin() + (u + 1) * group,
                          [](bool b) { return b; });
        }
      }
      const int64_t total_units = std::accumulate(live_units.begin(), live_units.end(), int64_t{0});

      auto plan = PlanCompaction(pages.Views(), spp, group);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->pages_after, (total_units + units - 1) / units);
      ASSERT_EQ(static_cast<int32_t>(plan->freed.size()), n - plan->pages_after);
      ASSERT_TRUE(std::is_sorted(plan->freed.begin(), plan->freed.end()));
      std::vector<bool> freed(n, false);
      for (int32_t p : plan->freed) freed[p] = true;

      // Full pages are kept and no move touches them; the fewest units move: the kept pages
      // are the fullest.
      int64_t moved_units = 0;
      for (const SlotMove& m : plan->moves) {
        ASSERT_TRUE(freed[m.src_page]) << "move from kept page " << m.src_page;
        ASSERT_FALSE(freed[m.dst_page]) << "move into freed page " << m.dst_page;
        ASSERT_NE(live_units[m.dst_page], units) << "move into full page " << m.dst_page;
        ASSERT_EQ(m.src_slot % group, 0);
        ASSERT_EQ(m.dst_slot % group, 0);
        ASSERT_EQ(m.slots % group, 0);
        ASSERT_GT(m.slots, 0);
        ASSERT_LE(m.src_slot + m.slots, spp);
        ASSERT_LE(m.dst_slot + m.slots, spp);
        moved_units += m.slots / group;
      }
      std::vector<int64_t> sorted_live = live_units;
      std::sort(sorted_live.rbegin(), sorted_live.rend());
      const int64_t kept_units =
          std::accumulate(sorted_live.begin(), sorted_live.begin() + plan->pages_after, int64_t{0});
      ASSERT_EQ(moved_units, total_units - kept_units);

      // Apply on the fake pages, checking that no move lands on a valid slot.
      std::vector<uint64_t*> bitmaps = pages.Bitmaps();
      const absl::Status st = ApplyCompaction(*plan, bitmaps, [&](const SlotMove& m) {
        for (int32_t k = 0; k < m.slots; ++k) {
          ASSERT_FALSE(valid[m.dst_page][m.dst_slot + k])
              << "move overwrites valid slot " << m.dst_slot + k << " of page " << m.dst_page;
        }
        for (int32_t k = 0; k < m.slots; ++k) {
          tokens[m.dst_page][m.dst_slot + k] = tokens[m.src_page][m.src_slot + k];
          valid[m.dst_page][m.dst_slot + k] = valid[m.src_page][m.src_slot + k];
          valid[m.src_page][m.src_slot + k] = false;
        }
      });
      ASSERT_TRUE(st.ok()) << st;

      // The bitmaps say what the model says, the live tokens are the same multiset, and each
      // token sits at the same offset of a group as before, with its group mates.
      std::multiset<int64_t> after;
      for (int32_t p = 0; p < n; ++p) {
        if (freed[p]) {
          ASSERT_EQ(CountValid(pages.words[p].data(), plan->used_before[p]), 0) << "page " << p;
          ASSERT_EQ(plan->used_after[p], 0);
          continue;
        }
        const int32_t used = plan->used_after[p];
        ASSERT_GE(used, plan->used_before[p]);
        ASSERT_LE(used, spp);
        for (int32_t s = 0; s < spp; ++s) {
          if (s >= used) {
            ASSERT_FALSE(valid[p][s]) << "valid slot " << s << " past used_after " << used;
            continue;
          }
          ASSERT_EQ(TestSlot(pages.words[p].data(), s), valid[p][s])
              << "page " << p << " slot " << s;
          if (!valid[p][s]) continue;
          const int64_t t = tokens[p][s];
          after.insert(t);
          ASSERT_EQ(t % spp % group, s % group) << "token " << t << " changed its group offset";
          const int32_t first = s - s % group;
          for (int32_t k = first; k < first + group; ++k) {
            if (valid[p][k]) {
              ASSERT_EQ(tokens[p][k] / group, t / group) << "group split";
            }
          }
        }
      }
      ASSERT_EQ(after, live_tokens);
    }
  }
}

}  // namespace
}  // namespace sluice::kvstore
