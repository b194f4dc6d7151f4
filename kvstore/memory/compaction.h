// Compaction planning for one page list (one (sequence, layer, kv head, tier)): pack the live
// slots of partially evicted pages into the fewest pages and give the emptied pages back to the
// pool (LeanKV §5.2 planning phase; SpvLLM sparse copy). Layout-agnostic: the plan names pages
// by their index in the list and slots by number; the caller copies the slot data (K/V codes,
// scales, scores, positions) however its page layout and device need.
//
//   SLUICE_ASSIGN_OR_RETURN(CompactionPlan plan, PlanCompaction(views, slots_per_page, group));
//   SLUICE_RETURN_IF_ERROR(ApplyCompaction(plan, bitmaps, copy_slots));
//   // then: used_slots = plan.used_after, pool.Free(ids of plan.freed), erase them from the table
#ifndef SLUICE_KVSTORE_MEMORY_COMPACTION_H_
#define SLUICE_KVSTORE_MEMORY_COMPACTION_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvstore/memory/slot_bitmap.h"

namespace sluice::kvstore {

// Copy `slots` consecutive slots from (src_page, src_slot) to (dst_page, dst_slot); pages are
// indices into the planned list.
struct SlotMove {
  int32_t src_page = 0;
  int32_t src_slot = 0;
  int32_t dst_page = 0;
  int32_t dst_slot = 0;
  int32_t slots = 0;

  bool operator==(const SlotMove&) const = default;
};

struct CompactionPlan {
  // Source pages are only freed pages and destinations only kept pages, and no two moves write
  // the same slot: the moves are independent and may run in any order or in parallel.
  std::vector<SlotMove> moves;
  std::vector<int32_t> freed;        // ascending indices of pages that end up empty
  std::vector<int32_t> used_before;  // [pages] each page's used_slots as planned
  std::vector<int32_t> used_after;   // [pages] used_slots after the moves; 0 for freed pages
  int32_t pages_after = 0;           // pages still holding live slots
};

// Plans the compaction of `pages` (one bitmap view each; slots at or past a page's used_slots
// count as empty) of slots_per_page slots each. Slots move in aligned groups of `group`: with
// per-channel quantized K, a group of tokens shares scales, so it moves or stays as a unit; a
// group is live if any of its slots is valid. The plan
//  - keeps the ceil(live groups / groups per page) fullest pages (ties: earlier pages), so
//    every full page stays untouched and the fewest groups move;
//  - moves each live group of the other pages, taken from the last page backwards, into the
//    first empty group of the earliest kept page with room (holes left by eviction first, then
//    slots past used_slots);
//  - frees the other pages, including those with no live slot.
// InvalidArgument unless slots_per_page > 0, group divides it, and every page has
// 0 <= used_slots <= slots_per_page (and words when used_slots > 0).
absl::StatusOr<CompactionPlan> PlanCompaction(absl::Span<const SlotBitmapView> pages,
                                              int32_t slots_per_page, int32_t group = 1);

// Indices of the pages with no valid slot below their used_slots: fully evicted pages that can
// go back to the pool without any copy (SpvLLM "free-block").
std::vector<int32_t> FindEmptyPages(absl::Span<const SlotBitmapView> pages);

// Carries out `plan` on the bitmaps of the planned pages (bitmaps[i] is page i's, with at least
// SlotBitmapWords(slots_per_page) words): calls copy_slots(move) for each move, in plan order,
// to copy the slot data, and moves the validity bits along (destination bits copied, source
// bits cleared; source bits at or past used_before count as clear). Bits of kept pages between
// used_before and used_after that no move writes are cleared. Freeing plan.freed and updating
// used_slots stays with the caller. InvalidArgument, before anything changes, if bitmaps does
// not have one non-null entry per planned page or a move names a page outside the plan.
absl::Status ApplyCompaction(const CompactionPlan& plan, absl::Span<uint64_t* const> bitmaps,
                             absl::FunctionRef<void(const SlotMove&)> copy_slots);

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_MEMORY_COMPACTION_H_
