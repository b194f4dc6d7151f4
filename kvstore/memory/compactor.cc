#include "kvstore/memory/compactor.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kvstore/memory/cuda/gpu_compaction.h"
#include "kvstore/memory/slot_bitmap.h"

namespace sluice::kvstore {
namespace {

absl::Status CheckLists(absl::Span<const CompactionList> lists, const kernels::KvPageLayout& layout,
                        const PoolMemory& memory) {
  for (size_t i = 0; i < lists.size(); ++i) {
    const CompactionList& list = lists[i];
    if (list.bitmaps.size() != list.pages.size() || list.used_slots.size() != list.pages.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("compaction list %d: %d pages, %d bitmaps and %d used-slot counts", i,
                          list.pages.size(), list.bitmaps.size(), list.used_slots.size()));
    }
    for (size_t p = 0; p < list.pages.size(); ++p) {
      if (list.pages[p] < 0 || list.pages[p] >= memory.pages || list.bitmaps[p] == nullptr ||
          list.used_slots[p] < 0 || list.used_slots[p] > layout.tokens) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "compaction list %d, page %d: id %d (pool of %d), %d used slots (of %d)%s", i, p,
            list.pages[p], memory.pages, list.used_slots[p], layout.tokens,
            list.bitmaps[p] == nullptr ? ", no bitmap" : ""));
      }
    }
  }
  return absl::OkStatus();
}

// A list's plan as PlanCompaction makes it from the host bitmaps.
absl::StatusOr<CompactionPlan> PlanOnHost(const CompactionList& list, int32_t slots_per_page) {
  std::vector<SlotBitmapView> views(list.pages.size());
  for (size_t p = 0; p < views.size(); ++p) {
    views[p] = {.words = list.bitmaps[p], .used_slots = list.used_slots[p]};
  }
  return PlanCompaction(views, slots_per_page);
}

// Plans on the host; the slots of every list move in one Backend::KvMoveSlots.
class HostCompactor final : public Compactor {
 public:
  HostCompactor(kernels::Backend& backend, const kernels::KvTierFormat& format,
                const kernels::KvPageLayout& layout, PoolMemory memory)
      : backend_(backend), format_(format), layout_(layout), memory_(memory) {}

  std::string_view planner() const override { return "host"; }
  bool moves_page_bits() const override { return false; }

  absl::Status Compact(absl::Span<const CompactionList> lists,
                       std::vector<CompactionPlan>* plans) override {
    SLUICE_RETURN_IF_ERROR(CheckLists(lists, layout_, memory_));
    plans->clear();
    plans->reserve(lists.size());
    for (const CompactionList& list : lists) {
      SLUICE_ASSIGN_OR_RETURN(CompactionPlan plan, PlanOnHost(list, layout_.tokens));
      plans->push_back(std::move(plan));
    }
    std::vector<kernels::KvSlotMove> moves;
    for (size_t i = 0; i < lists.size(); ++i) {
      const CompactionList& list = lists[i];
      SLUICE_RETURN_IF_ERROR(ApplyCompaction((*plans)[i], list.bitmaps, [&](const SlotMove& m) {
        moves.push_back({.src_page = list.pages[m.src_page],
                         .src_slot = m.src_slot,
                         .dst_page = list.pages[m.dst_page],
                         .dst_slot = m.dst_slot,
                         .slots = m.slots});
      }));
    }
    if (moves.empty()) return absl::OkStatus();
    return backend_.KvMoveSlots({.format = format_,
                                 .layout = layout_,
                                 .pool = {.data = memory_.base,
                                          .size = memory_.pages * memory_.page_bytes,
                                          .space = backend_.memory_space()},
                                 .pages = memory_.pages,
                                 .page_bytes = memory_.page_bytes,
                                 .moves = moves.data(),
                                 .count = static_cast<int64_t>(moves.size())});
  }

 private:
  kernels::Backend& backend_;
  const kernels::KvTierFormat format_;
  const kernels::KvPageLayout layout_;
  const PoolMemory memory_;
};

// Plans and moves on the GPU (GpuCompactor, on its own stream after the backend's work).
class CudaCompactor final : public Compactor {
 public:
  CudaCompactor(kernels::Backend& backend, std::unique_ptr<cuda::GpuCompactor> gpu,
                const kernels::KvPageLayout& layout, PoolMemory memory)
      : backend_(backend), gpu_(std::move(gpu)), layout_(layout), memory_(memory) {}

  std::string_view planner() const override { return "cuda"; }
  bool moves_page_bits() const override { return true; }

  absl::Status Compact(absl::Span<const CompactionList> lists,
                       std::vector<CompactionPlan>* plans) override {
    SLUICE_RETURN_IF_ERROR(CheckLists(lists, layout_, memory_));
    offsets_.assign(1, 0);
    ids_.clear();
    used_.clear();
    for (const CompactionList& list : lists) {
      ids_.insert(ids_.end(), list.pages.begin(), list.pages.end());
      used_.insert(used_.end(), list.used_slots.begin(), list.used_slots.end());
      offsets_.push_back(static_cast<int64_t>(ids_.size()));
    }
    // The step's kernels on the backend's stream may still be writing these pages.
    SLUICE_RETURN_IF_ERROR(backend_.Synchronize());
    SLUICE_RETURN_IF_ERROR(gpu_->Compact({offsets_, ids_, used_}, {.report_moves = true}, &r_));
    plans->assign(lists.size(), CompactionPlan{});
    for (size_t i = 0; i < lists.size(); ++i) {
      CompactionPlan& plan = (*plans)[i];
      const CompactionList& list = lists[i];
      plan.used_before.assign(list.used_slots.begin(), list.used_slots.end());
      plan.used_after.assign(r_.used_after.begin() + offsets_[i],
                             r_.used_after.begin() + offsets_[i + 1]);
      plan.pages_after = r_.pages_after[i];
      plan.freed.assign(r_.freed.begin() + r_.freed_offsets[i],
                        r_.freed.begin() + r_.freed_offsets[i + 1]);
      plan.moves.assign(r_.moves.begin() + r_.move_offsets[i],
                        r_.moves.begin() + r_.move_offsets[i + 1]);
      // The device's bits moved with its copies; the host's follow the same plan.
      SLUICE_RETURN_IF_ERROR(ApplyCompaction(plan, list.bitmaps, [](const SlotMove&) {}));
    }
    return absl::OkStatus();
  }

 private:
  kernels::Backend& backend_;
  const std::unique_ptr<cuda::GpuCompactor> gpu_;
  const kernels::KvPageLayout layout_;
  const PoolMemory memory_;
  // Reused from call to call.
  std::vector<int64_t> offsets_;
  std::vector<PageId> ids_;
  std::vector<int32_t> used_;
  cuda::GpuCompactionResult r_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Compactor>> CreateCompactor(kernels::Backend& backend,
                                                           const kernels::KvTierFormat& format,
                                                           const kernels::KvPageLayout& layout,
                                                           PoolMemory memory) {
  if (layout.token_group != 1 || format.huffman_bits > 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("compaction moves tokens slot by slot; this tier %s",
                        format.huffman_bits > 0 ? "is Huffman-coded" : "groups K along tokens"));
  }
  if (memory.base == nullptr || memory.pages <= 0 || memory.page_bytes < format.page_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("compaction pool of %d pages of %d bytes cannot hold %d-byte pages",
                        memory.pages, memory.page_bytes, format.page_bytes));
  }
  if (backend.kind() != kernels::BackendKind::kCuda) {
    return std::make_unique<HostCompactor>(backend, format, layout, memory);
  }
  SLUICE_ASSIGN_OR_RETURN(
      std::unique_ptr<cuda::GpuCompactor> gpu,
      cuda::GpuCompactor::Create(
          {.base = memory.base, .num_pages = memory.pages, .page_bytes = memory.page_bytes},
          format));
  return std::make_unique<CudaCompactor>(backend, std::move(gpu), layout, memory);
}

}  // namespace sluice::kvstore
