// The page pool: sizes and alignment, batch allocation by prefix sum, all-or-nothing errors,
// refcounted sharing, and many rounds of allocate/free checked against a std::set model.
#include "kvstore/memory/page_pool.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<PagePool> MakePool(int64_t num_pages, int64_t page_bytes = kDefaultPageBytes) {
  auto pool = PagePool::Create(num_pages, page_bytes);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

TEST(PagePool, CreateChecksSizes) {
  EXPECT_EQ(PagePool::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagePool::Create(-3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagePool::Create(int64_t{1} << 31).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(PagePool::Create(4, 100).status().message(), HasSubstr("multiple of 64"));
  EXPECT_EQ(PagePool::Create(4, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagePool::Create(4, -64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(PagePool::Create(1 << 30, int64_t{1} << 40).status().message(),
              HasSubstr("overflow"));
  // A valid size that no machine can back.
  EXPECT_EQ(PagePool::Create(1 << 30, int64_t{1} << 32).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(PagePool, PagesAreAlignedDisjointAndWritable) {
  auto pool = MakePool(8, 192);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_pages(), 8);
  EXPECT_EQ(pool->page_bytes(), 192);
  EXPECT_EQ(pool->free_pages(), 8);
  EXPECT_EQ(pool->used_pages(), 0);
  for (PageId id = 0; id < 8; ++id) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->data(id)) % kPageAlignment, 0u);
    std::fill_n(pool->data(id), 192, static_cast<uint8_t>(id));
  }
  for (PageId id = 0; id < 8; ++id) {
    EXPECT_EQ(pool->data(id + 0) - pool->data(0), id * 192);
    const PagePool& cpool = *pool;
    EXPECT_TRUE(std::all_of(cpool.data(id), cpool.data(id) + 192,
                            [&](uint8_t b) { return b == static_cast<uint8_t>(id); }));
  }
}

TEST(PagePool, BatchAllocateGivesEachRequestItsRange) {
  auto pool = MakePool(10);
  std::vector<int64_t> offsets;
  std::vector<PageId> ids;
  const std::vector<int32_t> counts = {2, 0, 3, 1};
  ASSERT_TRUE(pool->Allocate(counts, &offsets, &ids).ok());
  EXPECT_THAT(offsets, ElementsAre(0, 2, 2, 5, 6));
  // A fresh pool hands out ids in free-list order from the start pointer.
  EXPECT_THAT(ids, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_EQ(pool->free_pages(), 4);
  EXPECT_EQ(pool->used_pages(), 6);
  for (PageId id : ids) EXPECT_EQ(pool->refcount(id), 1);
  EXPECT_EQ(pool->refcount(6), 0);

  // An empty batch and a batch of zeros are fine and change nothing.
  ASSERT_TRUE(pool->Allocate({}, &offsets, &ids).ok());
  EXPECT_THAT(offsets, ElementsAre(0));
  EXPECT_TRUE(ids.empty());
  ASSERT_TRUE(pool->Allocate(std::vector<int32_t>{0, 0}, &offsets, &ids).ok());
  EXPECT_THAT(offsets, ElementsAre(0, 0, 0));
  EXPECT_EQ(pool->free_pages(), 4);
}

TEST(PagePool, AllocateIsAllOrNothing) {
  auto pool = MakePool(8);
  std::vector<int64_t> offsets;
  std::vector<PageId> ids;
  ASSERT_TRUE(pool->Allocate(std::vector<int32_t>{3}, &offsets, &ids).ok());

  absl::Status st = pool->Allocate(std::vector<int32_t>{2, 2, 2}, &offsets, &ids);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("asks for 6 pages but only 5 of 8 pages are free"));
  EXPECT_TRUE(offsets.empty());
  EXPECT_TRUE(ids.empty());
  EXPECT_EQ(pool->free_pages(), 5);

  st = pool->Allocate(std::vector<int32_t>{1, -2, 1}, &offsets, &ids);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("request 1 of the batch asks for -2 pages"));
  EXPECT_EQ(pool->free_pages(), 5);

  EXPECT_EQ(pool->Allocate(std::vector<int32_t>{1}, nullptr, &ids).code(),
            absl::StatusCode::kInvalidArgument);

  // After the failures the next allocation continues where the first one stopped.
  ASSERT_TRUE(pool->Allocate(std::vector<int32_t>{5}, &offsets, &ids).ok());
  EXPECT_THAT(ids, ElementsAre(3, 4, 5, 6, 7));
  EXPECT_EQ(pool->free_pages(), 0);
  EXPECT_EQ(pool->AllocateOne().status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PagePool, FreeRejectsBadIdsAndDoubleFreesChangingNothing) {
  auto pool = MakePool(4);
  std::vector<int64_t> offsets;
  std::vector<PageId> ids;
  ASSERT_TRUE(pool->Allocate(std::vector<int32_t>{3}, &offsets, &ids).ok());  // 0, 1, 2

  absl::Status st = pool->Free(std::vector<PageId>{0, 4});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("page 4"));
  EXPECT_EQ(pool->Free(std::vector<PageId>{kNoPage}).code(), absl::StatusCode::kInvalidArgument);

  st = pool->Free(std::vector<PageId>{0, 3});  // 3 was never allocated
  EXPECT_THAT(st.message(), HasSubstr("cannot free page 3"));
  st = pool->Free(std::vector<PageId>{1, 0, 2, 1});  // 1 listed twice with one reference
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("page 1"));
  EXPECT_THAT(st.message(), HasSubstr("double free"));
  for (PageId id : {0, 1, 2}) EXPECT_EQ(pool->refcount(id), 1) << id;
  EXPECT_EQ(pool->free_pages(), 1);

  ASSERT_TRUE(pool->Free(std::vector<PageId>{1}).ok());
  st = pool->Free(std::vector<PageId>{1});
  EXPECT_THAT(st.message(), HasSubstr("cannot free page 1"));
  EXPECT_EQ(pool->free_pages(), 2);

  // The pages that failed to free are still usable and the free list is intact.
  ASSERT_TRUE(pool->Free(std::vector<PageId>{2, 0}).ok());
  EXPECT_EQ(pool->free_pages(), 4);
  ASSERT_TRUE(pool->Allocate(std::vector<int32_t>{4}, &offsets, &ids).ok());
  // Free list order: 3 was never taken, then 1, 2, 0 in the order they came back.
  EXPECT_THAT(ids, ElementsAre(3, 1, 2, 0));
}

TEST(PagePool, SharedPageIsFreedAfterItsLastRelease) {
  auto pool = MakePool(4);
  const PageId prefix = *pool->AllocateOne();
  const PageId other = *pool->AllocateOne();
  // Two more sequences share the prefix page.
  ASSERT_TRUE(pool->Retain(std::vector<PageId>{prefix, prefix}).ok());
  EXPECT_EQ(pool->refcount(prefix), 3);

  ASSERT_TRUE(pool->Free(std::vector<PageId>{prefix, other}).ok());
  EXPECT_EQ(pool->refcount(prefix), 2);
  EXPECT_EQ(pool->refcount(other), 0);
  EXPECT_EQ(pool->free_pages(), 3);

  // Listing a page as often as it is referenced is allowed; once more is a double free.
  EXPECT_EQ(pool->Free(std::vector<PageId>{prefix, prefix, prefix}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->refcount(prefix), 2);
  ASSERT_TRUE(pool->Free(std::vector<PageId>{prefix}).ok());
  EXPECT_EQ(pool->free_pages(), 3);
  ASSERT_TRUE(pool->Free(std::vector<PageId>{prefix}).ok());
  EXPECT_EQ(pool->free_pages(), 4);
  EXPECT_EQ(pool->refcount(prefix), 0);

  // Retaining a free or unknown page fails and retains nothing.
  const PageId a = *pool->AllocateOne();
  absl::Status st = pool->Retain(std::vector<PageId>{a, prefix});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("it is free"));
  EXPECT_EQ(pool->refcount(a), 1);
  EXPECT_THAT(pool->Retain(std::vector<PageId>{a, 9}).message(), HasSubstr("page 9"));
  EXPECT_EQ(pool->refcount(a), 1);
  EXPECT_EQ(pool->refcount(-1), 0);
  EXPECT_EQ(pool->refcount(4), 0);
}

// Random batches of allocations, retains and frees against a model: a multiset of held
// references per page and the set of free pages. Small pools so that the start and end
// pointers wrap around many times.
TEST(PagePool, RandomRoundsMatchModel) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int64_t num_pages : {1, 7, 64, 1000}) {
    SCOPED_TRACE(num_pages);
    auto pool = MakePool(num_pages, 64);
    ASSERT_NE(pool, nullptr);
    std::set<PageId> free_model;
    for (PageId id = 0; id < num_pages; ++id) free_model.insert(id);
    std::map<PageId, int32_t> refs;  // allocated pages and their references
    std::vector<PageId> held;        // one entry per reference
    int64_t pages_handed_out = 0;

    for (int round = 0; round < 2000; ++round) {
      const int op = std::uniform_int_distribution<int>(0, 9)(rng);
      if (op < 5) {  // batch allocation, sometimes too large
        const int n = std::uniform_int_distribution<int>(0, 6)(rng);
        std::vector<int32_t> counts(n);
        int64_t total = 0;
        const int32_t max_count = static_cast<int32_t>(std::max<int64_t>(1, num_pages / 4));
        for (int32_t& c : counts) {
          c = std::uniform_int_distribution<int32_t>(0, max_count)(rng);
          total += c;
        }
        std::vector<int64_t> offsets;
        std::vector<PageId> ids;
        const absl::Status st = pool->Allocate(counts, &offsets, &ids);
        if (total > static_cast<int64_t>(free_model.size())) {
          ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
          ASSERT_EQ(pool->free_pages(), static_cast<int64_t>(free_model.size()));
          continue;
        }
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_EQ(offsets.size(), counts.size() + 1);
        for (int i = 0; i < n; ++i) ASSERT_EQ(offsets[i + 1] - offsets[i], counts[i]);
        ASSERT_EQ(static_cast<int64_t>(ids.size()), total);
        for (PageId id : ids) {
          ASSERT_EQ(free_model.erase(id), 1u) << "page " << id << " handed out while in use";
          refs[id] = 1;
          held.push_back(id);
        }
        pages_handed_out += total;
      } else if (op < 6 && !held.empty()) {  // share a few held pages
        std::vector<PageId> ids;
        const int n = std::uniform_int_distribution<int>(1, 3)(rng);
        for (int i = 0; i < n; ++i) {
          ids.push_back(held[std::uniform_int_distribution<size_t>(0, held.size() - 1)(rng)]);
        }
        ASSERT_TRUE(pool->Retain(ids).ok());
        for (PageId id : ids) {
          ++refs[id];
          held.push_back(id);
        }
      } else if (op < 9 && !held.empty()) {  // release a random subset of references
        std::shuffle(held.begin(), held.end(), rng);
        const size_t n = std::uniform_int_distribution<size_t>(1, held.size())(rng);
        std::vector<PageId> ids(held.end() - n, held.end());
        held.resize(held.size() - n);
        ASSERT_TRUE(pool->Free(ids).ok());
        for (PageId id : ids) {
          if (--refs[id] == 0) {
            refs.erase(id);
            free_model.insert(id);
          }
        }
      } else if (!free_model.empty()) {  // a double free of a free page fails, changing nothing
        const PageId victim = *free_model.begin();
        std::vector<PageId> ids = {victim};
        if (!held.empty()) ids.insert(ids.begin(), held.front());
        ASSERT_EQ(pool->Free(ids).code(), absl::StatusCode::kInvalidArgument);
      }
      ASSERT_EQ(pool->free_pages(), static_cast<int64_t>(free_model.size()));
      ASSERT_EQ(pool->used_pages(), static_cast<int64_t>(refs.size()));
    }
    for (PageId id = 0; id < num_pages; ++id) {
      const auto it = refs.find(id);
      ASSERT_EQ(pool->refcount(id), it == refs.end() ? 0 : it->second) << "page " << id;
    }
    // The pointers went around the circular list many times.
    EXPECT_GT(pages_handed_out, 20 * num_pages);
  }
}

// Batches above the parallel threshold give the same offsets and ids as the model.
TEST(PagePool, LargeBatchUsesTheSameLayout) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  constexpr int64_t kRequests = 3 * PagePool::kParallelScanMin + 17;
  auto pool = MakePool(4 * kRequests, 64);
  // Move the start pointer off zero so the batch wraps around the end of the list.
  std::vector<int64_t> offsets;
  std::vector<PageId> ids;
  ASSERT_TRUE(
      pool->Allocate(std::vector<int32_t>{static_cast<int32_t>(3 * kRequests)}, &offsets, &ids)
          .ok());
  ASSERT_TRUE(pool->Free(ids).ok());
  const std::vector<PageId> expected_order = [&] {
    std::vector<PageId> order;
    for (int64_t k = 3 * kRequests; k < 4 * kRequests; ++k) order.push_back(k);
    order.insert(order.end(), ids.begin(), ids.end());
    return order;
  }();

  std::vector<int32_t> counts(kRequests);
  for (int32_t& c : counts) c = std::uniform_int_distribution<int32_t>(0, 3)(rng);
  counts[kRequests / 2] = -1;
  EXPECT_THAT(pool->Allocate(counts, &offsets, &ids).message(),
              HasSubstr(absl::StrFormat("request %d of", kRequests / 2)));
  counts[kRequests / 2] = 2;
  ASSERT_TRUE(pool->Allocate(counts, &offsets, &ids).ok());
  int64_t sum = 0;
  for (int64_t i = 0; i < kRequests; ++i) {
    ASSERT_EQ(offsets[i], sum) << i;
    sum += counts[i];
  }
  ASSERT_EQ(offsets[kRequests], sum);
  ASSERT_EQ(static_cast<int64_t>(ids.size()), sum);
  for (int64_t k = 0; k < sum; ++k) {
    ASSERT_EQ(ids[k], expected_order[k]) << k;
    ASSERT_EQ(pool->refcount(ids[k]), 1);
  }
  EXPECT_EQ(pool->free_pages(), 4 * kRequests - sum);
}

}  // namespace
}  // namespace sluice::kvstore
