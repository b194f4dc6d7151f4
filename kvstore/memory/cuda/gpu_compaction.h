// Compaction of many page lists at once on the GPU (LeanKV §5.2 parallel KV compaction) and the
// sparse slot copy it is built on (SpvLLM; kernels/cuda/kv_slot_copy.h). A page list is one
// (sequence, layer, kv head, tier); its pages live in a device arena and carry their validity
// bitmaps at layout.valid.
//
//   SLUICE_ASSIGN_OR_RETURN(auto compactor, GpuCompactor::Create(pool->arena(), tier, stream));
//   GpuCompactionResult r;
//   SLUICE_RETURN_IF_ERROR(compactor->Compact({offsets, ids, used}, {}, &r));
//   SLUICE_RETURN_IF_ERROR(pool->Free(r.device_freed_ids, r.freed.size()));
//   // then per list: used_slots = r.used_after, erase the r.freed pages from its page table
//
// Each list is planned exactly as kvstore::PlanCompaction plans it (one thread block per list),
// and the result is byte-identical to PlanCompaction + ApplyCompaction with KvMoveSlot copies on
// the host: the same moves, freed pages and used_after, the same page bytes and bitmaps.
//
// Supported: every fixed-width tier (f16, fp8, int 2/4/8 with K grouped per token, tiled or
// not, with or without token scores and positions), and tiers whose K is grouped along tokens
// (per channel, KIVI; 2D blocks, KVComp), which move in whole token groups with their group
// metadata, as PlanCompaction's `group` = layout.token_group. Huffman-coded tiers are
// Unimplemented: their slots are parts of bit streams, not rows that can be copied.
//
// Inputs are host spans (the scheduler's page tables are on the host); Compact uploads them,
// plans and copies on the device, and returns the plan to the host. It synchronizes the stream
// twice: once to size the move list, once for the results. Pages shared with another sequence
// (refcount > 1) must not be passed: they would be changed under their other owners.
//
// Not thread-safe; one owner thread, one stream. Scratch memory (device and pinned) grows to the
// largest batch seen and is freed by the destructor.
#ifndef SLUICE_KVSTORE_MEMORY_CUDA_GPU_COMPACTION_H_
#define SLUICE_KVSTORE_MEMORY_CUDA_GPU_COMPACTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kv_format.h"
#include "kernels/op_params.h"
#include "kvstore/memory/compaction.h"
#include "kvstore/memory/cuda/gpu_page_allocator.h"
#include "kvstore/memory/page_pool.h"

namespace sluice::kvstore::cuda {

// A batch of page lists in CSR form, in host memory.
struct GpuPageLists {
  absl::Span<const int64_t> list_offsets;  // [lists + 1]; list l: pages [offsets[l], offsets[l+1])
  absl::Span<const PageId> page_ids;       // [pages] arena page ids, each at most once
  absl::Span<const int32_t> used_slots;    // [pages] slots written since each page was allocated
};

struct GpuCompactionOptions {
  // Return each list's moves (host page tables that track token positions need them).
  bool report_moves = true;
};

// The plans of a batch, per list as kvstore::CompactionPlan has them.
struct GpuCompactionResult {
  std::vector<int32_t> used_after;     // [pages] CompactionPlan::used_after, 0 for freed pages
  std::vector<int32_t> pages_after;    // [lists]
  std::vector<int64_t> freed_offsets;  // [lists + 1]
  std::vector<int32_t> freed;          // list l: [freed_offsets[l], freed_offsets[l + 1]), indices
                                       // in the list, ascending (CompactionPlan::freed)
  // With report_moves: list l's CompactionPlan::moves are [move_offsets[l], move_offsets[l + 1]).
  std::vector<int64_t> move_offsets;  // [lists + 1]
  std::vector<SlotMove> moves;
  int64_t moved_slots = 0;  // slots copied
  // The freed pages' arena ids in `freed` order, in device memory owned by the compactor, valid
  // until the next call: hand them to GpuPageAllocator::Free without a round trip.
  const PageId* device_freed_ids = nullptr;
};

// One slot move between arena pages, for SparseCopy: the backends' KvMoveSlots move.
using GpuSlotMove = kernels::KvSlotMove;

class GpuCompactor {
 public:
  // For pages of `format` in `arena` (device memory, not owned, outliving the compactor).
  // InvalidArgument for a format ComputePageLayout rejects, or an arena without pages or with
  // pages smaller than format.page_bytes; Unimplemented for Huffman-coded tiers. Touches no
  // device: a machine without one fails at the first Compact or SparseCopy.
  static absl::StatusOr<std::unique_ptr<GpuCompactor>> Create(GpuArena arena,
                                                              const kernels::KvTierFormat& format,
                                                              cudaStream_t stream = nullptr);

  GpuCompactor(const GpuCompactor&) = delete;
  GpuCompactor& operator=(const GpuCompactor&) = delete;
  ~GpuCompactor();

  const kernels::KvPageLayout& layout() const { return layout_; }

  // Plans and carries out the compaction of every list (see the top of this file) and fills
  // *result. InvalidArgument, before any device work, for malformed offsets, lengths that
  // disagree, a page id outside the arena or listed twice, used_slots outside
  // [0, slots per page], or a list too long to plan (pages * slots per page >= 2^31).
  absl::Status Compact(const GpuPageLists& lists, const GpuCompactionOptions& options,
                       GpuCompactionResult* result);

  // Copies each move's slots (K and V codes and metadata, score, position) from its source to
  // its destination page, and sets each destination slot's valid bit to its source's; sources
  // stay as they are. The moves run in parallel, so InvalidArgument, before any device work,
  // if two moves write the same slot or one writes a slot another reads; also for a page or
  // slot out of range, and, where K is grouped along tokens, for slots or slot counts that are
  // not multiples of the group. Synchronizes the stream.
  absl::Status SparseCopy(absl::Span<const GpuSlotMove> moves);

 private:
  GpuCompactor(GpuArena arena, const kernels::KvTierFormat& format,
               const kernels::KvPageLayout& layout, cudaStream_t stream);

  absl::Status CheckLists(const GpuPageLists& lists);

  struct State;  // device and pinned buffers, gpu_compaction.cc

  const GpuArena arena_;
  const kernels::KvTierFormat format_;
  const kernels::KvPageLayout layout_;
  cudaStream_t stream_;
  std::unique_ptr<State> state_;
};

}  // namespace sluice::kvstore::cuda

#endif  // SLUICE_KVSTORE_MEMORY_CUDA_GPU_COMPACTION_H_
