// The page table of the memory manager: BidirectionalPageTable holds the pages of one
// (sequence, layer, kv head), both tiers in one array (LeanKV §5.2): high-tier page ids grow
// from the left, low-tier ids from the right.
#ifndef SLUICE_KVSTORE_MEMORY_PAGE_TABLE_H_
#define SLUICE_KVSTORE_MEMORY_PAGE_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/memory/page_pool.h"

namespace sluice::kvstore {

// Layout of the array (what a kernel reads through data()):
//   [ high 0, high 1, ..., high h-1, kNoPage ..., low l-1, ..., low 1, low 0 ]
//     ^ index 0                                                      ^ capacity() - 1
// so high(i) is data()[i] and low(i) is data()[capacity() - 1 - i].
//
// When the two sides meet, a push grows the array to twice its capacity (at least 4): the high
// side is copied to the left end and the low side to the right end of the new array, keeping
// both orders; data() pointers are invalidated then. Reserve() sizes it up front (LeanKV sizes
// it to max sequence length / tokens per high-tier page, which never overflows since low-tier
// pages hold more tokens). Not thread-safe.
class BidirectionalPageTable {
 public:
  explicit BidirectionalPageTable(int32_t initial_capacity = 0);

  // Appends a page to a tier, growing the array if full. InvalidArgument for a negative id;
  // ResourceExhausted past 2^31 - 1 entries.
  absl::Status PushHigh(PageId id);
  absl::Status PushLow(PageId id);

  // Removes and returns the last page of a tier; OutOfRange when the tier is empty.
  absl::StatusOr<PageId> PopHigh();
  absl::StatusOr<PageId> PopLow();

  // Removes the i-th page of a tier (insertion order), shifting the later ones down by one so
  // the rest keep their order. OutOfRange for i outside [0, count).
  absl::Status EraseHigh(int32_t i);
  absl::Status EraseLow(int32_t i);

  // Puts `id` in place of the i-th page of a tier (copy-on-write of a shared page).
  // OutOfRange for i outside [0, count), InvalidArgument for a negative id.
  absl::Status ReplaceHigh(int32_t i, PageId id);
  absl::Status ReplaceLow(int32_t i, PageId id);

  // Forgets every page; keeps the capacity. The pages themselves are the caller's to free.
  void Clear();

  // Grows the array to at least `capacity` entries, keeping both sides.
  void Reserve(int32_t capacity);

  int32_t high_count() const { return high_count_; }
  int32_t low_count() const { return low_count_; }
  int32_t capacity() const { return static_cast<int32_t>(slots_.size()); }

  // The i-th page of a tier in insertion order; kNoPage for i outside [0, count).
  PageId high(int32_t i) const { return i >= 0 && i < high_count_ ? slots_[i] : kNoPage; }
  PageId low(int32_t i) const {
    return i >= 0 && i < low_count_ ? slots_[slots_.size() - 1 - i] : kNoPage;
  }

  // High-tier pages in insertion order, then low-tier pages in insertion order.
  std::vector<PageId> AllPages() const;

  // The raw array, [capacity()], laid out as above with kNoPage between the two sides.
  const PageId* data() const { return slots_.data(); }

 private:
  absl::Status MakeRoomForOne();
  void Regrow(int64_t capacity);

  std::vector<PageId> slots_;
  int32_t high_count_ = 0;
  int32_t low_count_ = 0;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_MEMORY_PAGE_TABLE_H_
