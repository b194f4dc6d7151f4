// The page pool: one arena of fixed-size KV pages and the circular free page list that hands
// them out (LeanKV §5.2), with batch allocation and recycling by prefix sum and reference
// counts for pages shared between sequences (common prompt prefixes).
//
//   SLUICE_ASSIGN_OR_RETURN(auto pool, PagePool::Create(4096));
//   std::vector<int64_t> offsets;
//   std::vector<PageId> ids;
//   SLUICE_RETURN_IF_ERROR(pool->Allocate(pages_per_head, &offsets, &ids));
//   // head h owns ids[offsets[h], offsets[h + 1])
//   SLUICE_RETURN_IF_ERROR(pool->Free(ids));
//
// The free list is an array of all N page ids. Free pages form one contiguous circular run
// starting at the start pointer; allocation takes pages from the start pointer and recycling
// writes ids at the end pointer (start + free_pages, mod N). Because the free region stays
// contiguous, a batch of requests gets conflict-free ranges from an exclusive prefix sum of
// its counts, which is what lets the GPU pool (and a large CPU batch) work in parallel.
//
// Not thread-safe: a pool belongs to one owner thread (the decode scheduler loop), which also
// runs the batch operations; large batches use OpenMP threads internally.
#ifndef SLUICE_KVSTORE_MEMORY_PAGE_POOL_H_
#define SLUICE_KVSTORE_MEMORY_PAGE_POOL_H_

#include <cassert>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::kvstore {

using PageId = int32_t;
inline constexpr PageId kNoPage = -1;
inline constexpr int64_t kDefaultPageBytes = 16 * 1024;
inline constexpr int64_t kPageAlignment = 64;  // bytes; arena and every page start on it

class PagePool {
 public:
  // One host arena of num_pages pages of page_bytes bytes each. InvalidArgument unless
  // 1 <= num_pages <= 2^31 - 1 and page_bytes is a positive multiple of 64 (or the arena would
  // overflow int64); ResourceExhausted if the arena cannot be allocated. The arena is not
  // zeroed: a page's bytes are unspecified until its owner writes them, and a recycled page
  // keeps what its previous owner wrote.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(int64_t num_pages,
                                                          int64_t page_bytes = kDefaultPageBytes);

  // The same over memory the caller owns (a transport's exposed region): at least
  // num_pages * page_bytes bytes, 64-byte aligned, outliving the pool.
  static absl::StatusOr<std::unique_ptr<PagePool>> CreateOver(
      uint8_t* arena, size_t arena_bytes, int64_t num_pages,
      int64_t page_bytes = kDefaultPageBytes);

  // InvalidArgument unless the shape is one Create takes: 1 <= num_pages <= 2^31 - 1 and
  // page_bytes a positive multiple of 64 whose arena fits an int64.
  static absl::Status CheckShape(int64_t num_pages, int64_t page_bytes);

  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;
  ~PagePool();

  // The first byte of page `id`, 64-byte aligned. No checks, this is the hot path: `id` must
  // be in [0, num_pages()) (asserted in debug builds only). The pool does not track whether
  // the page is allocated.
  uint8_t* data(PageId id) { return arena_ + Offset(id); }
  const uint8_t* data(PageId id) const { return arena_ + Offset(id); }

  int64_t page_bytes() const { return page_bytes_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const { return free_count_; }
  int64_t used_pages() const { return num_pages_ - free_count_; }

  // Batch allocation: request i asks for counts[i] pages (0 is fine). On success *offsets holds
  // n + 1 entries (the exclusive prefix sum of counts, offsets[n] = total) and request i owns
  // (*ids)[offsets[i], offsets[i + 1]); every new page has refcount 1. All or nothing:
  // InvalidArgument for a negative count, ResourceExhausted when the batch asks for more pages
  // than are free; on error the pool is unchanged and both vectors are left empty.
  // Batches of more than kParallelScanMin requests run the scan on OpenMP threads.
  absl::Status Allocate(absl::Span<const int32_t> counts, std::vector<int64_t>* offsets,
                        std::vector<PageId>* ids);

  // One page with refcount 1; ResourceExhausted when none is free.
  absl::StatusOr<PageId> AllocateOne();

  // Adds one reference to each id (an id listed k times gains k). InvalidArgument, naming the
  // id, for an id out of range or not allocated; ResourceExhausted if a refcount would pass
  // 2^31 - 1. Nothing changes on error.
  absl::Status Retain(absl::Span<const PageId> ids);

  // Drops one reference from each id; pages whose refcount reaches zero return to the free
  // list at the end pointer, in the order they reach zero. InvalidArgument, naming the id, for
  // an id out of range or dropped more often than it is referenced (a double free); the same
  // id may appear k times only if its refcount is at least k. Nothing changes on error.
  absl::Status Free(absl::Span<const PageId> ids);

  // References held on page `id`: 0 for a free page and for an id out of range.
  int32_t refcount(PageId id) const;

  // Batches with more requests than this compute their prefix sum (and set refcounts) on OpenMP
  // threads. On a busy 2-core host the sequential scan still won at 65536 requests (42 us
  // against 80 us) and lost only at 1M; waking a thread team costs a few microseconds, so the
  // break-even on an idle many-core decode host is lower. Re-measure there before tuning.
  static constexpr int64_t kParallelScanMin = 1 << 16;

 private:
  struct ArenaFree {
    void operator()(uint8_t* p) const;
  };

  PagePool(uint8_t* arena, int64_t num_pages, int64_t page_bytes);

  int64_t Offset(PageId id) const {
    assert(id >= 0 && id < num_pages_);
    return int64_t{id} * page_bytes_;
  }

  std::unique_ptr<uint8_t, ArenaFree> arena_owner_;
  uint8_t* const arena_;
  const int64_t num_pages_;
  const int64_t page_bytes_;
  // Circular free page list: the free pages are free_list_[(start_ + k) % num_pages_] for
  // k in [0, free_count_); the end pointer is (start_ + free_count_) % num_pages_.
  std::vector<PageId> free_list_;
  int64_t start_ = 0;
  int64_t free_count_;
  std::vector<int32_t> refcount_;  // [num_pages]; 0 = free
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_MEMORY_PAGE_POOL_H_
