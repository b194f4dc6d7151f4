// Kernels of GPU compaction (see gpu_compaction_kernels.h for the plan they compute).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kvstore/memory/cuda/gpu_compaction_kernels.h"

namespace sluice::kvstore::cuda {
namespace {

using u64 = unsigned long long;  // the type CUDA's 64-bit atomics take

constexpr int kPlanThreads = 128;  // per list
constexpr int kWarp = 32;
constexpr int kPageThreads = 256;

// ---- bitmaps (kvstore/memory/slot_bitmap.h semantics: slot s is bit s % 64 of word s / 64)
// ----------

__device__ __forceinline__ const u64* Bitmap(const CompactionBatch& b, int64_t page) {
  return reinterpret_cast<const u64*>(b.arena + int64_t{b.page_ids[page]} * b.page_bytes + b.valid);
}

__device__ __forceinline__ int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

// Bits [0, n) of a word, n in [0, 64].
__device__ __forceinline__ u64 LowBits(int64_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

// Set bits among slots [lo, hi).
__device__ __forceinline__ int64_t CountSet(const u64* words, int64_t lo, int64_t hi) {
  int64_t count = 0;
  while (lo < hi) {
    const int64_t take = Min(64 - (lo & 63), hi - lo);
    count += __popcll((words[lo >> 6] >> (lo & 63)) & LowBits(take));
    lo += take;
  }
  return count;
}

__device__ __forceinline__ bool AnySet(const u64* words, int64_t lo, int64_t hi) {
  while (lo < hi) {
    const int64_t take = Min(64 - (lo & 63), hi - lo);
    if ((words[lo >> 6] >> (lo & 63)) & LowBits(take)) return true;
    lo += take;
  }
  return false;
}

// Whether unit u (slots [u * group, (u + 1) * group)) has a valid slot below `used`.
__device__ __forceinline__ bool UnitLive(const u64* words, int32_t used, int32_t group, int64_t u) {
  const int64_t lo = u * group;
  const int64_t hi = Min(used, lo + group);
  return lo < hi && AnySet(words, lo, hi);
}

// Live units among units [0, u).
__device__ __forceinline__ int64_t LiveUnitsBefore(const u64* words, int32_t used, int32_t group,
                                                   int64_t u) {
  if (group == 1) return CountSet(words, 0, Min(u, used));
  int64_t count = 0;
  for (int64_t v = 0; v < u; ++v) count += UnitLive(words, used, group, v);
  return count;
}

// Index of the d-th (from 0) set bit of x; x has more than d set bits.
__device__ int SelectBit(u64 x, int64_t d) {
  for (; d > 0; --d) x &= x - 1;
  return __ffsll(static_cast<long long>(x)) - 1;
}

// The d-th (from 0) dead unit of a page of `units` units: a unit with no valid slot below
// `used`. -1 if there are not that many.
__device__ __forceinline__ int64_t NthDeadUnit(const u64* words, int32_t used, int32_t group,
                                               int64_t units, int64_t d) {
  if (group == 1) {
    for (int64_t lo = 0; lo < units; lo += 64) {
      const int64_t width = Min(64, units - lo);
      // Valid bits below `used` in this word; slots at or past `used` are dead.
      const u64 live = lo < used ? words[lo >> 6] & LowBits(used - lo) : 0ull;
      const u64 dead = ~live & LowBits(width);
      const int64_t count = __popcll(dead);
      if (d < count) return lo + SelectBit(dead, d);
      d -= count;
    }
    return -1;
  }
  for (int64_t u = 0; u < units; ++u) {
    if (UnitLive(words, used, group, u)) continue;
    if (d == 0) return u;
    --d;
  }
  return -1;
}

// ---- planning: one block per list ----------------------------------------------------------

__global__ void __launch_bounds__(kPlanThreads) PlanKernel(CompactionBatch b) {
  const int64_t list = blockIdx.x;
  const int64_t first = b.list_offsets[list];
  const int64_t n = b.list_offsets[list + 1] - first;
  const int32_t group = b.group;
  const int64_t units = b.slots_per_page / group;

  SLUICE_SHARED(total_live, u64);
  if (threadIdx.x == 0) total_live = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t page = first + i;
    const int32_t used = b.used_before[page];
    int64_t live = 0;
    if (used > 0) {
      const u64* words = Bitmap(b, page);
      if (group == 1) {
        live = CountSet(words, 0, used);
      } else {
        for (int64_t u = 0; u * group < used; ++u) live += UnitLive(words, used, group, u);
      }
    }
    b.live[page] = static_cast<int32_t>(live);
    atomicAdd(&total_live, static_cast<u64>(live));
  }
  __syncthreads();

  // Rank in a stable sort by live units, descending: pages with more, then equal pages before.
  const int64_t pages_after = (static_cast<int64_t>(total_live) + units - 1) / units;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t mine = b.live[first + i];
    int64_t rank = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int32_t other = b.live[first + j];
      rank += other > mine || (other == mine && j < i);
    }
    b.kept[first + i] = rank < pages_after;
  }
  __syncthreads();

  // Numbering of holes and source units: a sequential pass over the list's pages (a few
  // hundred at most), cheap next to the ranking above.
  if (threadIdx.x == 0) {
    int32_t holes = 0, kept = 0, freed = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t page = first + i;
      if (b.kept[page]) {
        b.rank[page] = kept;
        b.kept_pages[first + kept] = static_cast<int32_t>(i);
        ++kept;
        b.order[page] = holes;
        holes += static_cast<int32_t>(units) - b.live[page];
        b.used_after[page] = b.used_before[page];
      } else {
        b.rank[page] = freed++;
        b.used_after[page] = 0;
      }
    }
    int32_t sources = 0;
    for (int64_t i = n - 1; i >= 0; --i) {
      const int64_t page = first + i;
      if (b.kept[page]) continue;
      b.order[page] = sources;
      sources += b.live[page];
    }
    b.list_moves[list] = sources;
    b.list_freed[list] = freed;
  }
}

// At least 4 blocks per SM: with no floor ptxas spills at 32 registers on sm_80.
__global__ void __launch_bounds__(kPlanThreads, 4) EmitKernel(CompactionBatch b, CompactionEmit e) {
  const int64_t list = blockIdx.x;
  const int64_t first = b.list_offsets[list];
  const int64_t n = b.list_offsets[list + 1] - first;
  const int32_t group = b.group;
  const int64_t units = b.slots_per_page / group;
  const int64_t move_base = e.move_offsets[list];
  const int64_t freed_base = e.freed_offsets[list];
  const int64_t kept_count = n - (e.freed_offsets[list + 1] - freed_base);

  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t page = first + i;
    if (b.kept[page]) continue;
    const int64_t at = freed_base + b.rank[page];
    e.freed_ids[at] = b.page_ids[page];
    e.freed_index[at] = static_cast<int32_t>(i);
  }

  // One thread per (page, unit) of the list; the live units of freed pages move.
  // 32-bit division (a list's units stay far below 2^31): a 64-bit one is a call with a stack.
  for (int64_t t = threadIdx.x; t < n * units; t += blockDim.x) {
    const int32_t i = static_cast<int32_t>(t) / static_cast<int32_t>(units);
    const int32_t u = static_cast<int32_t>(t) - i * static_cast<int32_t>(units);
    const int64_t page = first + i;
    if (b.kept[page]) continue;
    const int32_t used = b.used_before[page];
    const u64* words = Bitmap(b, page);
    if (!UnitLive(words, used, group, u)) continue;
    const int64_t q = b.order[page] + LiveUnitsBefore(words, used, group, u);
    // The kept page whose holes hold hole q: the last (in ascending order) whose first hole is
    // at or before q. Kept pages without holes share their first hole with the next one and are
    // passed over; some kept page has room, as the plan keeps enough pages.
    int64_t lo = 0, hi = kept_count - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (b.order[first + b.kept_pages[first + mid]] <= q) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int32_t j = b.kept_pages[first + lo];
    const int64_t dst = first + j;
    const int64_t dst_unit =
        NthDeadUnit(Bitmap(b, dst), b.used_before[dst], group, units, q - b.order[dst]);
    const int64_t at = move_base + q;
    if (dst_unit < 0) {  // the plan keeps room for every live unit; never copy out of a page
      e.moves[at] = DeviceSlotMove{b.page_ids[page], 0, b.page_ids[page], 0, 0, 0};
      *e.no_hole = 1;
      continue;
    }
    const int32_t dst_slot = static_cast<int32_t>(dst_unit * group);
    e.moves[at] = DeviceSlotMove{.src_page = b.page_ids[page],
                                 .src_slot = static_cast<int32_t>(u * group),
                                 .dst_page = b.page_ids[dst],
                                 .dst_slot = dst_slot,
                                 .slots = group,
                                 .src_used = used};
    e.move_src_index[at] = static_cast<int32_t>(i);
    e.move_dst_index[at] = j;
    atomicMax(&b.used_after[dst], dst_slot + group);
  }
}

__global__ void ClearGrownKernel(CompactionBatch b, int64_t pages) {
  for (int64_t page = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; page < pages;
       page += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!b.kept[page]) continue;
    u64* words =
        reinterpret_cast<u64*>(b.arena + int64_t{b.page_ids[page]} * b.page_bytes + b.valid);
    int64_t lo = b.used_before[page];
    const int64_t hi = b.used_after[page];
    while (lo < hi) {  // this thread owns the page's bitmap here: no atomics
      const int64_t take = Min(64 - (lo & 63), hi - lo);
      words[lo >> 6] &= ~(LowBits(take) << (lo & 63));
      lo += take;
    }
  }
}

}  // namespace

cudaError_t LaunchPlanCompaction(const CompactionBatch& b, cudaStream_t stream) {
  if (b.lists <= 0) return cudaSuccess;
  SLUICE_LAUNCH(static_cast<unsigned>(b.lists), kPlanThreads, 0, stream, PlanKernel)(b);
  return cudaGetLastError();
}

cudaError_t LaunchEmitCompaction(const CompactionBatch& b, const CompactionEmit& e,
                                 cudaStream_t stream) {
  if (b.lists <= 0) return cudaSuccess;
  SLUICE_LAUNCH(static_cast<unsigned>(b.lists), kPlanThreads, 0, stream, EmitKernel)(b, e);
  return cudaGetLastError();
}

cudaError_t LaunchClearGrownSlots(const CompactionBatch& b, int64_t pages, cudaStream_t stream) {
  if (pages <= 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((pages + kPageThreads - 1) / kPageThreads, 4096);
  SLUICE_LAUNCH(static_cast<unsigned>(blocks), kPageThreads, 0, stream, ClearGrownKernel)(b, pages);
  return cudaGetLastError();
}

}  // namespace sluice::kvstore::cuda
