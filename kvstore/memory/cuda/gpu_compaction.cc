#include "kvstore/memory/cuda/gpu_compaction.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_array.h"
#include "kvstore/memory/cuda/device_scan.h"
#include "kvstore/memory/cuda/gpu_compaction_kernels.h"

namespace sluice::kvstore::cuda {

using kernels::cuda::CudaDeviceAvailable;
using kernels::cuda::CudaEvent;
using kernels::cuda::DeviceArray;
using kernels::cuda::LaunchSparseCopy;
using kernels::cuda::PinnedArray;
using kernels::cuda::SlotCopyLayout;
using kernels::cuda::SparseCopyParams;
namespace {

using kernels::KvPageLayout;
using kernels::KvTierFormat;

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

}  // namespace

struct GpuCompactor::State {
  SlotCopyLayout copy;
  bool used_device = false;  // the destructor then waits for queued work

  // Page ids seen in the current batch: stamp[id] == generation (the duplicate check).
  std::vector<uint32_t> stamp;
  uint32_t generation = 0;

  // Inputs.
  PinnedArray<int64_t> offsets_host;
  PinnedArray<int32_t> ids_host;
  PinnedArray<int32_t> used_host;
  DeviceArray<int64_t> list_offsets;
  DeviceArray<int32_t> page_ids;
  DeviceArray<int32_t> used_before;
  // Planning state, per page and per list.
  DeviceArray<int32_t> live;
  DeviceArray<uint8_t> kept;
  DeviceArray<int32_t> rank;
  DeviceArray<int32_t> order;
  DeviceArray<int32_t> kept_pages;
  DeviceArray<int32_t> used_after;
  DeviceArray<int32_t> list_moves;  // [lists + 1], the last 0
  DeviceArray<int32_t> list_freed;  // [lists + 1], the last 0
  DeviceArray<int64_t> move_offsets;
  DeviceArray<int64_t> freed_offsets;
  DeviceArray<uint8_t> scan_temp;
  int64_t scan_temp_items = 0;
  // The plan.
  DeviceArray<DeviceSlotMove> moves;
  DeviceArray<int32_t> move_src_index;
  DeviceArray<int32_t> move_dst_index;
  DeviceArray<int32_t> freed_ids;
  DeviceArray<int32_t> freed_index;
  DeviceArray<int32_t> no_hole;  // [1]
  // Results on their way back.
  PinnedArray<int64_t> totals_host;   // [2] unit moves, freed pages
  PinnedArray<int32_t> no_hole_host;  // [1]
  PinnedArray<int32_t> used_after_host;
  PinnedArray<int64_t> freed_offsets_host;
  PinnedArray<int32_t> freed_index_host;
  PinnedArray<int64_t> move_offsets_host;
  PinnedArray<DeviceSlotMove> moves_host;
  PinnedArray<int32_t> move_src_index_host;
  PinnedArray<int32_t> move_dst_index_host;
  // SparseCopy's moves.
  PinnedArray<DeviceSlotMove> copy_host;
  DeviceArray<DeviceSlotMove> copy_moves;

  absl::Status EnsureScanTemp(int64_t items) {
    if (items <= scan_temp_items) return absl::OkStatus();
    size_t bytes = 0;
    SLUICE_CUDA_RETURN_IF_ERROR(ExclusiveScanTempBytes(items, &bytes));
    SLUICE_RETURN_IF_ERROR(scan_temp.Reserve(static_cast<int64_t>(bytes) + 1));
    scan_temp_items = items;
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<GpuCompactor>> GpuCompactor::Create(GpuArena arena,
                                                                   const KvTierFormat& format,
                                                                   cudaStream_t stream) {
  if (format.huffman_bits > 0.f) {
    return absl::UnimplementedError(absl::StrFormat(
        "GPU compaction of Huffman-coded tiers (%s) is not implemented: their slots are parts of "
        "bit streams, not rows that can be copied; compact a fixed-width tier instead",
        kernels::KvTierFormatName(format)));
  }
  SLUICE_ASSIGN_OR_RETURN(const KvPageLayout layout, kernels::ComputePageLayout(format));
  if (arena.base == nullptr || arena.num_pages < 1 || arena.num_pages > kMaxInt32) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GPU compaction needs a device arena of 1 to %d pages, not %d pages at %p",
                        kMaxInt32, arena.num_pages, arena.base));
  }
  if (arena.page_bytes < format.page_bytes || arena.page_bytes % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the arena's %d-byte pages cannot hold %d-byte pages of %s (or are not a "
                        "multiple of 64 bytes)",
                        arena.page_bytes, format.page_bytes, kernels::KvTierFormatName(format)));
  }
  return std::unique_ptr<GpuCompactor>(new GpuCompactor(arena, format, layout, stream));
}

GpuCompactor::GpuCompactor(GpuArena arena, const KvTierFormat& format, const KvPageLayout& layout,
                           cudaStream_t stream)
    : arena_(arena),
      format_(format),
      layout_(layout),
      stream_(stream),
      state_(std::make_unique<State>()) {
  state_->copy = kernels::cuda::SlotCopyLayoutOf(format, layout);
}

GpuCompactor::~GpuCompactor() {
  // Queued work may still use the buffers the state frees.
  if (state_->used_device) cudaStreamSynchronize(stream_);
}

absl::Status GpuCompactor::CheckLists(const GpuPageLists& lists) {
  const int64_t pages = static_cast<int64_t>(lists.page_ids.size());
  if (static_cast<int64_t>(lists.used_slots.size()) != pages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GPU compaction: %d page ids but %d used_slots counts", pages, lists.used_slots.size()));
  }
  if (lists.list_offsets.empty()) {
    if (pages == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "GPU compaction: %d pages but no list offsets (want lists + 1 entries)", pages));
  }
  const int64_t n = static_cast<int64_t>(lists.list_offsets.size()) - 1;
  if (n > kMaxInt32) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GPU compaction plans at most %d lists at once, not %d", kMaxInt32, n));
  }
  if (lists.list_offsets[0] != 0 || lists.list_offsets[n] != pages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GPU compaction: list offsets must run from 0 to the %d pages, not from "
                        "%d to %d",
                        pages, lists.list_offsets[0], lists.list_offsets[n]));
  }
  State& s = *state_;
  if (s.stamp.empty()) s.stamp.assign(arena_.num_pages, 0);
  if (++s.generation == 0) {  // wrapped: forget every stamp
    std::fill(s.stamp.begin(), s.stamp.end(), 0);
    s.generation = 1;
  }
  for (int64_t l = 0; l < n; ++l) {
    if (lists.list_offsets[l + 1] < lists.list_offsets[l]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GPU compaction: list offsets decrease at list %d (%d, then %d)", l,
                          lists.list_offsets[l], lists.list_offsets[l + 1]));
    }
  }
  // The offsets run from 0 to `pages` without decreasing: every index below is in range.
  const int64_t slots = layout_.tokens;
  for (int64_t l = 0; l < n; ++l) {
    const int64_t first = lists.list_offsets[l];
    const int64_t last = lists.list_offsets[l + 1];
    if ((last - first) * slots > kMaxInt32) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GPU compaction: list %d has %d pages of %d slots; a list holds fewer than 2^31 slots", l,
          last - first, slots));
    }
    for (int64_t k = first; k < last; ++k) {
      const PageId id = lists.page_ids[k];
      const int32_t used = lists.used_slots[k];
      if (id < 0 || id >= arena_.num_pages) {
        return absl::InvalidArgumentError(
            absl::StrFormat("GPU compaction: page %d of list %d has id %d; the arena has pages "
                            "0..%d",
                            k - first, l, id, arena_.num_pages - 1));
      }
      if (s.stamp[id] == s.generation) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "GPU compaction: page id %d is listed twice (again as page %d of list %d); lists "
            "compacted together must not share pages",
            id, k - first, l));
      }
      s.stamp[id] = s.generation;
      if (used < 0 || used > slots) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "GPU compaction: page %d of list %d (id %d) has %d used slots; a page has %d",
            k - first, l, id, used, slots));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GpuCompactor::Compact(const GpuPageLists& lists, const GpuCompactionOptions& options,
                                   GpuCompactionResult* result) {
  if (result == nullptr) return absl::InvalidArgumentError("GpuCompactor::Compact: null result");
  SLUICE_RETURN_IF_ERROR(CheckLists(lists));
  const int64_t n = lists.list_offsets.empty() ? 0 : lists.list_offsets.size() - 1;
  const int64_t pages = static_cast<int64_t>(lists.page_ids.size());
  *result = GpuCompactionResult();
  result->freed_offsets.assign(n + 1, 0);
  result->pages_after.assign(n, 0);
  if (options.report_moves) result->move_offsets.assign(n + 1, 0);
  if (pages == 0) return absl::OkStatus();

  State& s = *state_;
  s.used_device = true;
  const int32_t group = layout_.token_group;
  SLUICE_RETURN_IF_ERROR(s.offsets_host.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(s.ids_host.Reserve(pages));
  SLUICE_RETURN_IF_ERROR(s.used_host.Reserve(pages));
  for (DeviceArray<int32_t>* a :
       {&s.page_ids, &s.used_before, &s.live, &s.rank, &s.order, &s.kept_pages, &s.used_after}) {
    SLUICE_RETURN_IF_ERROR(a->Reserve(pages));
  }
  SLUICE_RETURN_IF_ERROR(s.kept.Reserve(pages));
  SLUICE_RETURN_IF_ERROR(s.list_offsets.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(s.list_moves.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(s.list_freed.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(s.move_offsets.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(s.freed_offsets.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(s.EnsureScanTemp(n + 1));
  SLUICE_RETURN_IF_ERROR(s.totals_host.Reserve(2));
  SLUICE_RETURN_IF_ERROR(s.no_hole.Reserve(1));
  SLUICE_RETURN_IF_ERROR(s.no_hole_host.Reserve(1));

  // Upload (the previous call ended with a synchronization: the staging buffers are free).
  std::memcpy(s.offsets_host.data(), lists.list_offsets.data(), (n + 1) * sizeof(int64_t));
  std::memcpy(s.ids_host.data(), lists.page_ids.data(), pages * sizeof(int32_t));
  std::memcpy(s.used_host.data(), lists.used_slots.data(), pages * sizeof(int32_t));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.list_offsets.data(), s.offsets_host.data(),
                                              (n + 1) * sizeof(int64_t), cudaMemcpyHostToDevice,
                                              stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.page_ids.data(), s.ids_host.data(),
                                              pages * sizeof(int32_t), cudaMemcpyHostToDevice,
                                              stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.used_before.data(), s.used_host.data(),
                                              pages * sizeof(int32_t), cudaMemcpyHostToDevice,
                                              stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(s.list_moves.data() + n, 0, sizeof(int32_t), stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(s.list_freed.data() + n, 0, sizeof(int32_t), stream_));

  CompactionBatch batch{.arena = arena_.base,
                        .page_bytes = arena_.page_bytes,
                        .valid = layout_.valid,
                        .slots_per_page = layout_.tokens,
                        .group = group,
                        .lists = n,
                        .list_offsets = s.list_offsets.data(),
                        .page_ids = s.page_ids.data(),
                        .used_before = s.used_before.data(),
                        .live = s.live.data(),
                        .kept = s.kept.data(),
                        .rank = s.rank.data(),
                        .order = s.order.data(),
                        .kept_pages = s.kept_pages.data(),
                        .used_after = s.used_after.data(),
                        .list_moves = s.list_moves.data(),
                        .list_freed = s.list_freed.data()};
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchPlanCompaction(batch, stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchExclusiveScan(s.list_moves.data(), s.move_offsets.data(), n + 1,
                                                  s.scan_temp.data(), s.scan_temp.bytes(),
                                                  stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchExclusiveScan(s.list_freed.data(), s.freed_offsets.data(),
                                                  n + 1, s.scan_temp.data(), s.scan_temp.bytes(),
                                                  stream_));
  // The move list's size decides the buffers of the next pass: read the totals back.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.totals_host.data(), s.move_offsets.data() + n,
                                              sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.totals_host.data() + 1, s.freed_offsets.data() + n,
                                              sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const int64_t total_moves = s.totals_host.data()[0];
  const int64_t total_freed = s.totals_host.data()[1];

  SLUICE_RETURN_IF_ERROR(s.moves.Reserve(std::max<int64_t>(1, total_moves)));
  SLUICE_RETURN_IF_ERROR(s.move_src_index.Reserve(std::max<int64_t>(1, total_moves)));
  SLUICE_RETURN_IF_ERROR(s.move_dst_index.Reserve(std::max<int64_t>(1, total_moves)));
  SLUICE_RETURN_IF_ERROR(s.freed_ids.Reserve(std::max<int64_t>(1, total_freed)));
  SLUICE_RETURN_IF_ERROR(s.freed_index.Reserve(std::max<int64_t>(1, total_freed)));
  const CompactionEmit emit{.move_offsets = s.move_offsets.data(),
                            .freed_offsets = s.freed_offsets.data(),
                            .moves = s.moves.data(),
                            .move_src_index = s.move_src_index.data(),
                            .move_dst_index = s.move_dst_index.data(),
                            .freed_ids = s.freed_ids.data(),
                            .freed_index = s.freed_index.data(),
                            .no_hole = s.no_hole.data()};
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s.no_hole.data(), 0, sizeof(int32_t), stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchEmitCompaction(batch, emit, stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchClearGrownSlots(batch, pages, stream_));
  const SparseCopyParams copy{.arena = arena_.base,
                              .page_bytes = arena_.page_bytes,
                              .layout = s.copy,
                              .moves = s.moves.data(),
                              .num_moves = total_moves,
                              .clear_source = true};
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchSparseCopy(copy, stream_));

  // Results.
  SLUICE_RETURN_IF_ERROR(s.used_after_host.Reserve(pages));
  SLUICE_RETURN_IF_ERROR(s.freed_offsets_host.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(s.freed_index_host.Reserve(std::max<int64_t>(1, total_freed)));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.no_hole_host.data(), s.no_hole.data(),
                                              sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.used_after_host.data(), s.used_after.data(),
                                              pages * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                              stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.freed_offsets_host.data(), s.freed_offsets.data(),
                                              (n + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                              stream_));
  if (total_freed > 0) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.freed_index_host.data(), s.freed_index.data(),
                                                total_freed * sizeof(int32_t),
                                                cudaMemcpyDeviceToHost, stream_));
  }
  if (options.report_moves) {
    SLUICE_RETURN_IF_ERROR(s.move_offsets_host.Reserve(n + 1));
    SLUICE_RETURN_IF_ERROR(s.moves_host.Reserve(std::max<int64_t>(1, total_moves)));
    SLUICE_RETURN_IF_ERROR(s.move_src_index_host.Reserve(std::max<int64_t>(1, total_moves)));
    SLUICE_RETURN_IF_ERROR(s.move_dst_index_host.Reserve(std::max<int64_t>(1, total_moves)));
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.move_offsets_host.data(), s.move_offsets.data(),
                                                (n + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                                stream_));
    if (total_moves > 0) {
      SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.moves_host.data(), s.moves.data(),
                                                  total_moves * sizeof(DeviceSlotMove),
                                                  cudaMemcpyDeviceToHost, stream_));
      SLUICE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(s.move_src_index_host.data(), s.move_src_index.data(),
                          total_moves * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
      SLUICE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(s.move_dst_index_host.data(), s.move_dst_index.data(),
                          total_moves * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    }
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (*s.no_hole_host.data() != 0) {
    return absl::InternalError(
        "GPU compaction: a live slot group found no room in the kept pages; the plan is "
        "inconsistent (a bug), and the pages of this batch are partly compacted");
  }

  result->used_after.assign(s.used_after_host.data(), s.used_after_host.data() + pages);
  result->freed_offsets.assign(s.freed_offsets_host.data(), s.freed_offsets_host.data() + n + 1);
  result->freed.assign(s.freed_index_host.data(), s.freed_index_host.data() + total_freed);
  for (int64_t l = 0; l < n; ++l) {
    const int64_t list_pages = lists.list_offsets[l + 1] - lists.list_offsets[l];
    const int64_t freed = result->freed_offsets[l + 1] - result->freed_offsets[l];
    result->pages_after[l] = static_cast<int32_t>(list_pages - freed);
  }
  result->moved_slots = total_moves * group;
  result->device_freed_ids = total_freed > 0 ? s.freed_ids.data() : nullptr;
  if (options.report_moves) {
    // One unit per device move; merge runs as PlanCompaction does, within each list.
    result->moves.reserve(total_moves);
    const int64_t* unit_offsets = s.move_offsets_host.data();
    for (int64_t l = 0; l < n; ++l) {
      result->move_offsets[l] = static_cast<int64_t>(result->moves.size());
      for (int64_t q = unit_offsets[l]; q < unit_offsets[l + 1]; ++q) {
        const DeviceSlotMove& d = s.moves_host.data()[q];
        const SlotMove m{.src_page = s.move_src_index_host.data()[q],
                         .src_slot = d.src_slot,
                         .dst_page = s.move_dst_index_host.data()[q],
                         .dst_slot = d.dst_slot,
                         .slots = d.slots};
        SlotMove* last = static_cast<int64_t>(result->moves.size()) > result->move_offsets[l]
                             ? &result->moves.back()
                             : nullptr;
        if (last != nullptr && last->src_page == m.src_page && last->dst_page == m.dst_page &&
            last->src_slot + last->slots == m.src_slot &&
            last->dst_slot + last->slots == m.dst_slot) {
          last->slots += m.slots;
        } else {
          result->moves.push_back(m);
        }
      }
    }
    result->move_offsets[n] = static_cast<int64_t>(result->moves.size());
  }
  return absl::OkStatus();
}

absl::Status GpuCompactor::SparseCopy(absl::Span<const GpuSlotMove> moves) {
  const int64_t slots = layout_.tokens;
  const int32_t group = layout_.token_group;
  absl::flat_hash_set<int64_t> written;
  int64_t count = 0;
  auto slot_key = [&](PageId page, int64_t slot) { return int64_t{page} * slots + slot; };
  for (size_t i = 0; i < moves.size(); ++i) {
    const GpuSlotMove& m = moves[i];
    const bool pages_ok = m.src_page >= 0 && m.src_page < arena_.num_pages && m.dst_page >= 0 &&
                          m.dst_page < arena_.num_pages;
    const bool slots_ok = m.slots >= 0 && m.src_slot >= 0 && m.dst_slot >= 0 &&
                          int64_t{m.src_slot} + m.slots <= slots &&
                          int64_t{m.dst_slot} + m.slots <= slots;
    if (!pages_ok || !slots_ok) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sparse copy: move %d (%d slots from page %d slot %d to page %d slot %d) is outside "
          "the arena's %d pages of %d slots; nothing was copied",
          i, m.slots, m.src_page, m.src_slot, m.dst_page, m.dst_slot, arena_.num_pages, slots));
    }
    if (m.src_slot % group != 0 || m.dst_slot % group != 0 || m.slots % group != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sparse copy: move %d (%d slots from slot %d to slot %d) splits a group of %d tokens "
          "that share K scales (%s); nothing was copied",
          i, m.slots, m.src_slot, m.dst_slot, group, kernels::KvTierFormatName(format_)));
    }
    for (int32_t k = 0; k < m.slots; ++k) {
      if (!written.insert(slot_key(m.dst_page, m.dst_slot + k)).second) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "sparse copy: slot %d of page %d is written by more than one move (again by move "
            "%d); nothing was copied",
            m.dst_slot + k, m.dst_page, i));
      }
    }
    if (m.slots > 0) ++count;
  }
  for (size_t i = 0; i < moves.size(); ++i) {
    const GpuSlotMove& m = moves[i];
    for (int32_t k = 0; k < m.slots; ++k) {
      if (written.contains(slot_key(m.src_page, m.src_slot + k))) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "sparse copy: move %d reads slot %d of page %d, which a move writes; the moves run "
            "in parallel, so split them into two calls; nothing was copied",
            i, m.src_slot + k, m.src_page));
      }
    }
  }
  if (count == 0) return absl::OkStatus();
  State& s = *state_;
  s.used_device = true;
  SLUICE_RETURN_IF_ERROR(s.copy_host.Reserve(count));
  SLUICE_RETURN_IF_ERROR(s.copy_moves.Reserve(count));
  int64_t at = 0;
  for (const GpuSlotMove& m : moves) {
    if (m.slots == 0) continue;
    s.copy_host.data()[at++] = DeviceSlotMove{.src_page = m.src_page,
                                              .src_slot = m.src_slot,
                                              .dst_page = m.dst_page,
                                              .dst_slot = m.dst_slot,
                                              .slots = m.slots,
                                              .src_used = static_cast<int32_t>(slots)};
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.copy_moves.data(), s.copy_host.data(),
                                              count * sizeof(DeviceSlotMove),
                                              cudaMemcpyHostToDevice, stream_));
  const SparseCopyParams copy{.arena = arena_.base,
                              .page_bytes = arena_.page_bytes,
                              .layout = s.copy,
                              .moves = s.copy_moves.data(),
                              .num_moves = count,
                              .clear_source = false};
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchSparseCopy(copy, stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace sluice::kvstore::cuda
