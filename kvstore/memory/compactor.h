// Compaction of a batch of page lists of one tier in one pool, where the pool's memory is: the
// cache calls it once per step for every list that eviction left with a page's worth of dead
// slots (LeanKV §5.2: many lists compacted in parallel), and the backend's device decides who
// plans and who copies.
//
//   SLUICE_ASSIGN_OR_RETURN(auto compactor, CreateCompactor(backend, format, layout, memory));
//   std::vector<CompactionPlan> plans;
//   SLUICE_RETURN_IF_ERROR(compactor->Compact(lists, &plans));
//   // then per list: used_slots = plans[i].used_after, free the pages of plans[i].freed
//
//  - host memory (ref, cpu backends): PlanCompaction and ApplyCompaction per list on the host,
//    the slots of the whole batch moved by one Backend::KvMoveSlots;
//  - a CUDA device: GpuCompactor (kvstore/memory/cuda/gpu_compaction.h) plans every list on the
//    device from the pages' own valid bits, one thread block per list, and moves the slots there
//    with the same sparse copy; the plans come back to the host, and the host bitmaps follow
//    them.
// Both give the plans PlanCompaction gives and the same page bytes.
#ifndef SLUICE_KVSTORE_MEMORY_COMPACTOR_H_
#define SLUICE_KVSTORE_MEMORY_COMPACTOR_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/kv_format.h"
#include "kvstore/memory/compaction.h"
#include "kvstore/memory/page_pool.h"

namespace sluice::kvstore {

// The pages of a pool in the backend's memory: page `id` starts at base + id * page_bytes.
struct PoolMemory {
  uint8_t* base = nullptr;
  int64_t pages = 0;
  int64_t page_bytes = 0;
};

// One list to compact: its pages in list order, the host's copy of each page's valid bits and
// each page's used slots. The pages belong to this list only (no page shared with another list
// or sequence).
struct CompactionList {
  absl::Span<const PageId> pages;
  absl::Span<uint64_t* const> bitmaps;   // [pages], SlotBitmapWords(layout.tokens) words each
  absl::Span<const int32_t> used_slots;  // [pages]
};

class Compactor {
 public:
  virtual ~Compactor() = default;

  // "host" or "cuda": where the lists are planned.
  virtual std::string_view planner() const = 0;
  // Whether the pages' own valid bits end equal to the host bitmaps (GpuCompactor moves them on
  // the device as the plan does). When false, only each moved slot's destination is marked valid
  // there, and a caller keeping the bits apart from the pages writes its bitmaps back.
  virtual bool moves_page_bits() const = 0;

  // Plans every list as PlanCompaction(views, layout.tokens) plans it (plans[i] is list i's) and
  // carries the plans out: the moved slots' codes, metadata, scores and positions are copied
  // between the pool's pages, and each list's host bitmaps end as ApplyCompaction leaves them.
  // The pages' own valid bits (in the pool's memory) must equal the host bitmaps before the
  // call; afterwards see moves_page_bits(). Freeing the plans'
  // freed pages and updating the lists' used slots stay with the caller. InvalidArgument,
  // before anything changes, for a list whose lengths disagree.
  virtual absl::Status Compact(absl::Span<const CompactionList> lists,
                               std::vector<CompactionPlan>* plans) = 0;
};

// The compactor for pages of `format` (laid out by `layout`) in `memory`, on `backend`'s device:
// the GPU's on CUDA, the host's elsewhere. Only tiers whose tokens move slot by slot:
// InvalidArgument for K grouped along tokens or Huffman-coded tiers (their slots are not rows
// that can be moved one at a time) and for memory that does not hold a page of the format.
absl::StatusOr<std::unique_ptr<Compactor>> CreateCompactor(kernels::Backend& backend,
                                                           const kernels::KvTierFormat& format,
                                                           const kernels::KvPageLayout& layout,
                                                           PoolMemory memory);

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_MEMORY_COMPACTOR_H_
