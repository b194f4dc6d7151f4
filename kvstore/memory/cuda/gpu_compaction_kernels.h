// Internal to gpu_compaction: the planning kernels (one block per page list) and the sparse slot
// copy kernel, as launch functions that enqueue work on a stream and return the launch error.
// No absl here: nvcc compiles this header. Parameters must be valid; GpuCompactor checks them.
//
// Planning follows kvstore::PlanCompaction exactly, in parallel. With "units" the aligned groups
// of `group` slots and a unit live when it has a valid slot below the page's used_slots:
//  1. live units per page; pages_after = ceil(live units of the list / units per page);
//  2. a page is kept when its rank in (live units descending, index ascending) is below
//     pages_after (a stable sort's first pages_after);
//  3. the live units of the freed pages, in order (page descending, unit ascending), numbered
//     q = 0, 1, ..., go to the dead units of the kept pages, in order (page ascending, unit
//     ascending): source q to hole q. This is what PlanCompaction's cursor walk produces, as
//     the walk reads the bitmaps before any move.
#ifndef SLUICE_KVSTORE_MEMORY_CUDA_GPU_COMPACTION_KERNELS_H_
#define SLUICE_KVSTORE_MEMORY_CUDA_GPU_COMPACTION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kv_slot_copy.h"

namespace sluice::kvstore::cuda {

using kernels::cuda::DeviceSlotMove;

// A batch of page lists in CSR form and the per-page planning state. All device memory.
struct CompactionBatch {
  uint8_t* arena;  // [num_pages * page_bytes]; LaunchClearGrownSlots writes bitmaps
  int64_t page_bytes;
  int32_t valid;           // bitmap offset in a page
  int32_t slots_per_page;  // multiple of group
  int32_t group;
  int64_t lists;
  // [lists + 1]: list l holds pages [list_offsets[l], list_offsets[l + 1]).
  const int64_t* list_offsets;
  const int32_t* page_ids;     // [pages] arena ids
  const int32_t* used_before;  // [pages] in [0, slots_per_page]
  // Written by LaunchPlanCompaction:
  int32_t* live;        // [pages] live units
  uint8_t* kept;        // [pages] 1: the page stays
  int32_t* rank;        // [pages] index among the list's kept pages, or among its freed pages
  int32_t* order;       // [pages] kept: index of its first hole; freed: of its first source unit
  int32_t* kept_pages;  // [pages] the list's first pages_after entries: kept pages, ascending
  int32_t* used_after;  // [pages] used_before for kept pages (grown by the emit pass), 0 freed
  int32_t* list_moves;  // [lists] units the list moves
  int32_t* list_freed;  // [lists] pages the list frees
};

// Plans every list: one block per list.
cudaError_t LaunchPlanCompaction(const CompactionBatch& b, cudaStream_t stream);

struct CompactionEmit {
  const int64_t* move_offsets;   // [lists + 1] exclusive scan of list_moves
  const int64_t* freed_offsets;  // [lists + 1] exclusive scan of list_freed
  DeviceSlotMove* moves;         // [total moves] one unit each, in plan order per list
  int32_t* move_src_index;       // [total moves] source page's index in its list
  int32_t* move_dst_index;       // [total moves] destination page's index in its list
  int32_t* freed_ids;            // [total freed] arena ids, ascending index per list
  int32_t* freed_index;          // [total freed] index in the list
  int32_t* no_hole;              // [1] set to 1 if a unit found no hole (cannot happen)
};

// Writes every list's unit moves and freed pages, and grows used_after of the destinations: one
// block per list.
cudaError_t LaunchEmitCompaction(const CompactionBatch& b, const CompactionEmit& e,
                                 cudaStream_t stream);

// Clears the validity bits of kept pages in [used_before, used_after) (stale bits of a
// recycled page), before the copy sets the moved ones. One thread per page.
cudaError_t LaunchClearGrownSlots(const CompactionBatch& b, int64_t pages, cudaStream_t stream);

}  // namespace sluice::kvstore::cuda

#endif  // SLUICE_KVSTORE_MEMORY_CUDA_GPU_COMPACTION_KERNELS_H_
