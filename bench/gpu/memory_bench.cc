#include "bench/gpu/memory_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_array.h"
#include "kernels/kv_format.h"
#include "kvstore/kv_preset.h"
#include "kvstore/memory/compaction.h"
#include "kvstore/memory/cuda/gpu_compaction.h"
#include "kvstore/memory/cuda/gpu_page_allocator.h"
#include "kvstore/memory/page_pool.h"
#include "kvstore/memory/slot_bitmap.h"

namespace sluice::bench {
namespace {

using kernels::cuda::CudaEvent;
using kernels::cuda::DeviceArray;
using kvstore::PageId;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs reset() untimed then step() timed, warmup + repeats times; the median of the timed runs
// in microseconds. `time` times one step and returns its duration.
template <typename Reset, typename Time>
absl::StatusOr<double> MedianUs(const MemoryBenchOptions& o, Reset reset, Time time) {
  std::vector<double> us;
  for (int r = 0; r < o.warmup + o.repeats; ++r) {
    SLUICE_RETURN_IF_ERROR(reset());
    SLUICE_ASSIGN_OR_RETURN(const double t, time());
    if (r >= o.warmup) us.push_back(t);
  }
  return Median(std::move(us));
}

// Wall-clock microseconds of fn() (an absl::Status).
template <typename Fn>
absl::StatusOr<double> HostUs(Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  SLUICE_RETURN_IF_ERROR(fn());
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// CUDA event microseconds of fn() on `stream` (fn may synchronize on its own).
template <typename Fn>
absl::StatusOr<double> DeviceUs(cudaStream_t stream, const CudaEvent& start, const CudaEvent& stop,
                                Fn fn) {
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream));
  SLUICE_RETURN_IF_ERROR(fn());
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
  float ms = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return 1e3 * ms;
}

absl::Status CheckOptions(const MemoryBenchOptions& o) {
  auto fraction_ok = [](double f) { return f >= 0 && f <= 1; };
  if (o.batches.empty() || *std::min_element(o.batches.begin(), o.batches.end()) < 1 ||
      o.layers < 1 || o.kv_heads < 1 || o.context < 1 || o.repeats < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError(
        "memory bench: batches, layers, kv_heads, context and repeats must be >= 1 and warmup "
        ">= 0");
  }
  if (!fraction_ok(o.new_page_fraction) || !fraction_ok(o.compact_fraction) ||
      !fraction_ok(o.evicted_fraction)) {
    return absl::InvalidArgumentError(
        "memory bench: new_page_fraction, compact_fraction and evicted_fraction are in [0, 1]");
  }
  if (!o.gpu && !o.cpu) {
    return absl::InvalidArgumentError("memory bench: nothing to run (gpu and cpu both off)");
  }
  return absl::OkStatus();
}

// The step's inputs for one batch size.
struct Step {
  int64_t page_lists = 0;
  int64_t pages_per_list = 0;
  std::vector<int32_t> new_pages;  // [page_lists] 0 or 1
  int64_t pages_allocated = 0;
  // Compaction: `lists` lists of pages_per_list pages each, pages 0..n-1 of a host arena.
  int64_t lists = 0;
  std::vector<int64_t> offsets;
  std::vector<PageId> ids;
  std::vector<int32_t> used;
  std::vector<uint8_t> pristine;  // the arena before compaction
};

Step MakeStep(const MemoryBenchOptions& o, const kernels::KvPageLayout& l, int batch,
              std::mt19937_64& rng) {
  Step s;
  s.page_lists = int64_t{batch} * o.layers * o.kv_heads;
  s.pages_per_list = (o.context + l.tokens - 1) / l.tokens;
  std::bernoulli_distribution opens(o.new_page_fraction);
  s.new_pages.resize(s.page_lists);
  for (int32_t& c : s.new_pages) s.pages_allocated += (c = opens(rng) ? 1 : 0);

  s.lists = o.compact_fraction > 0
                ? std::max<int64_t>(1, std::llround(s.page_lists * o.compact_fraction))
                : 0;
  const int64_t pages = s.lists * s.pages_per_list;
  s.pristine.resize(pages * o.page_bytes);
  for (size_t k = 0; k + 8 <= s.pristine.size(); k += 8) {
    const uint64_t r = rng();
    std::memcpy(&s.pristine[k], &r, 8);
  }
  s.offsets.push_back(0);
  std::vector<int32_t> slot_order(o.context);
  for (int64_t list = 0; list < s.lists; ++list) {
    // Evict evicted_fraction of the context's slots at random.
    std::iota(slot_order.begin(), slot_order.end(), 0);
    std::shuffle(slot_order.begin(), slot_order.end(), rng);
    std::vector<bool> live(o.context, true);
    const int64_t evicted = std::llround(o.context * o.evicted_fraction);
    for (int64_t k = 0; k < evicted; ++k) live[slot_order[k]] = false;
    for (int64_t i = 0; i < s.pages_per_list; ++i) {
      const PageId id = static_cast<PageId>(s.ids.size());
      const int32_t used =
          static_cast<int32_t>(std::min<int64_t>(l.tokens, o.context - i * int64_t{l.tokens}));
      uint64_t* bits =
          reinterpret_cast<uint64_t*>(s.pristine.data() + int64_t{id} * o.page_bytes + l.valid);
      for (int32_t slot = 0; slot < used; ++slot) {
        if (live[i * l.tokens + slot]) {
          kvstore::SetSlot(bits, slot);
        } else {
          kvstore::ClearSlot(bits, slot);
        }
      }
      s.ids.push_back(id);
      s.used.push_back(used);
    }
    s.offsets.push_back(static_cast<int64_t>(s.ids.size()));
  }
  return s;
}

struct CpuTimes {
  double alloc_us = 0;
  double compact_us = 0;
  int64_t moves = 0;
  int64_t freed = 0;
};

absl::StatusOr<CpuTimes> RunCpu(const MemoryBenchOptions& o, const kernels::KvTierFormat& f,
                                const kernels::KvPageLayout& l, const Step& s) {
  CpuTimes t;
  // (a) A pool holding every list's pages, plus room for the step; ids only (64-byte pages).
  const int64_t occupied = s.page_lists * s.pages_per_list;
  SLUICE_ASSIGN_OR_RETURN(auto pool,
                          kvstore::PagePool::Create(occupied + s.pages_allocated + 1, 64));
  {
    std::vector<int64_t> offsets;
    std::vector<PageId> ids;
    SLUICE_RETURN_IF_ERROR(
        pool->Allocate(std::vector<int32_t>(s.page_lists, static_cast<int32_t>(s.pages_per_list)),
                       &offsets, &ids));
  }
  std::vector<int64_t> offsets;
  std::vector<PageId> ids;
  SLUICE_ASSIGN_OR_RETURN(
      t.alloc_us, MedianUs(
                      o, [] { return absl::OkStatus(); },
                      [&] {
                        return HostUs([&]() -> absl::Status {
                          SLUICE_RETURN_IF_ERROR(pool->Allocate(s.new_pages, &offsets, &ids));
                          return pool->Free(ids);
                        });
                      }));

  // (b)
  if (s.lists == 0) return t;
  std::vector<uint8_t> arena(s.pristine.size());
  auto page = [&](PageId id) { return arena.data() + int64_t{id} * o.page_bytes; };
  std::vector<kvstore::SlotBitmapView> views;
  std::vector<uint64_t*> bitmaps;
  SLUICE_ASSIGN_OR_RETURN(
      t.compact_us,
      MedianUs(
          o,
          [&] {
            std::memcpy(arena.data(), s.pristine.data(), arena.size());
            return absl::OkStatus();
          },
          [&] {
            t.moves = t.freed = 0;
            return HostUs([&]() -> absl::Status {
              for (int64_t list = 0; list < s.lists; ++list) {
                const int64_t first = s.offsets[list];
                const int64_t n = s.offsets[list + 1] - first;
                views.clear();
                bitmaps.clear();
                for (int64_t i = 0; i < n; ++i) {
                  uint64_t* bits = reinterpret_cast<uint64_t*>(page(s.ids[first + i]) + l.valid);
                  views.push_back({bits, s.used[first + i]});
                  bitmaps.push_back(bits);
                }
                SLUICE_ASSIGN_OR_RETURN(const kvstore::CompactionPlan plan,
                                        kvstore::PlanCompaction(views, l.tokens, l.token_group));
                SLUICE_RETURN_IF_ERROR(
                    kvstore::ApplyCompaction(plan, bitmaps, [&](const kvstore::SlotMove& m) {
                      const uint8_t* src = page(s.ids[first + m.src_page]);
                      uint8_t* dst = page(s.ids[first + m.dst_page]);
                      for (int32_t k = 0; k < m.slots; ++k) {
                        kernels::KvMoveSlot(f, l, src, m.src_slot + k, dst, m.dst_slot + k);
                      }
                      t.moves += m.slots;
                    }));
                t.freed += static_cast<int64_t>(plan.freed.size());
              }
              return absl::OkStatus();
            });
          }));
  return t;
}

struct GpuTimes {
  double alloc_us = 0;
  double compact_us = 0;
  int64_t moves = 0;
  int64_t freed = 0;
};

absl::StatusOr<GpuTimes> RunGpu(const MemoryBenchOptions& o, const kernels::KvTierFormat& f,
                                const Step& s) {
  GpuTimes t;
  const cudaStream_t stream = nullptr;
  SLUICE_ASSIGN_OR_RETURN(CudaEvent start, CudaEvent::Create(/*timing=*/true));
  SLUICE_ASSIGN_OR_RETURN(CudaEvent stop, CudaEvent::Create(/*timing=*/true));

  // (a)
  const int64_t occupied = s.page_lists * s.pages_per_list;
  SLUICE_ASSIGN_OR_RETURN(auto pool, kvstore::cuda::GpuPageAllocator::Create(
                                         occupied + s.pages_allocated + 1, 0, stream));
  SLUICE_RETURN_IF_ERROR(
      pool->Allocate(std::vector<int32_t>(s.page_lists, static_cast<int32_t>(s.pages_per_list)))
          .status());
  SLUICE_ASSIGN_OR_RETURN(t.alloc_us,
                          MedianUs(
                              o, [] { return absl::OkStatus(); },
                              [&] {
                                return DeviceUs(stream, start, stop, [&]() -> absl::Status {
                                  SLUICE_ASSIGN_OR_RETURN(auto a, pool->Allocate(s.new_pages));
                                  return pool->Free(a.ids, a.total);
                                });
                              }));

  // (b)
  if (s.lists == 0) return t;
  const int64_t pages = static_cast<int64_t>(s.ids.size());
  SLUICE_ASSIGN_OR_RETURN(auto arena, DeviceArray<uint8_t>::Create(s.pristine.size()));
  SLUICE_ASSIGN_OR_RETURN(auto pristine, DeviceArray<uint8_t>::Create(s.pristine.size()));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(pristine.data(), s.pristine.data(), s.pristine.size(), cudaMemcpyHostToDevice));
  SLUICE_ASSIGN_OR_RETURN(auto compactor, kvstore::cuda::GpuCompactor::Create(
                                              {arena.data(), pages, o.page_bytes}, f, stream));
  kvstore::cuda::GpuCompactionResult result;
  const kvstore::cuda::GpuPageLists lists{s.offsets, s.ids, s.used};
  SLUICE_ASSIGN_OR_RETURN(
      t.compact_us,
      MedianUs(
          o,
          [&]() -> absl::Status {
            SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                arena.data(), pristine.data(), arena.bytes(), cudaMemcpyDeviceToDevice, stream));
            SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
            return absl::OkStatus();
          },
          [&] {
            return DeviceUs(stream, start, stop, [&] {
              return compactor->Compact(lists, {.report_moves = false}, &result);
            });
          }));
  t.moves = result.moved_slots;
  t.freed = static_cast<int64_t>(result.freed.size());
  return t;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunMemoryBench(const MemoryBenchOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckOptions(options));
  SLUICE_ASSIGN_OR_RETURN(
      const kvstore::KvPreset preset,
      kvstore::FindKvPreset(options.preset, options.head_dim, options.page_bytes));
  kernels::KvTierFormat format = preset.high;
  format.token_meta = options.token_meta;
  SLUICE_ASSIGN_OR_RETURN(const kernels::KvPageLayout layout, kernels::ComputePageLayout(format));
  if (format.huffman_bits > 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory bench: preset %s codes its high tier with Huffman codes, which GPU compaction "
        "does not support; pick a fixed-width preset",
        options.preset));
  }
  if (options.gpu) SLUICE_RETURN_IF_ERROR(kernels::cuda::CudaDeviceAvailable());

  std::mt19937_64 rng(options.seed);
  nlohmann::json rows = nlohmann::json::array();
  for (const int batch : options.batches) {
    const Step step = MakeStep(options, layout, batch, rng);
    nlohmann::json row = {{"batch", batch},
                          {"page_lists", step.page_lists},
                          {"pages_allocated", step.pages_allocated},
                          {"lists", step.lists},
                          {"slots_per_page", layout.tokens},
                          {"format", kernels::KvTierFormatName(format)},
                          {"gpu_alloc_us", nullptr},
                          {"gpu_compact_us", nullptr},
                          {"cpu_alloc_us", nullptr},
                          {"cpu_compact_us", nullptr}};
    std::optional<CpuTimes> cpu;
    std::optional<GpuTimes> gpu;
    if (options.cpu) {
      SLUICE_ASSIGN_OR_RETURN(cpu, RunCpu(options, format, layout, step));
      row["cpu_alloc_us"] = cpu->alloc_us;
      row["cpu_compact_us"] = cpu->compact_us;
      row["moves"] = cpu->moves;
      row["pages_freed"] = cpu->freed;
    }
    if (options.gpu) {
      SLUICE_ASSIGN_OR_RETURN(gpu, RunGpu(options, format, step));
      row["gpu_alloc_us"] = gpu->alloc_us;
      row["gpu_compact_us"] = gpu->compact_us;
      row["moves"] = gpu->moves;
      row["pages_freed"] = gpu->freed;
    }
    if (cpu && gpu && (cpu->moves != gpu->moves || cpu->freed != gpu->freed)) {
      return absl::InternalError(absl::StrFormat(
          "memory bench, batch %d: the GPU compaction moved %d slots and freed %d pages, the "
          "CPU %d and %d",
          batch, gpu->moves, gpu->freed, cpu->moves, cpu->freed));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace sluice::bench
