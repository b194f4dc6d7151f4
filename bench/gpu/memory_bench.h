// The memory manager's cost per decode step, GPU against CPU (LeanKV Figure 11): for each batch
// size, at Llama-3-8B shapes (32 layers x 8 kv heads, one page list per (sequence, layer,
// head)), the time to
//  (a) allocate the step's new pages and free as many (GpuPageAllocator against PagePool with
//      its single-threaded scan), and
//  (b) compact the page lists that have evicted slots (GpuCompactor, one launch for all lists,
//      against PlanCompaction + ApplyCompaction + KvMoveSlot list by list on host pages).
// GPU times are CUDA event times on the pool's stream, host staging and synchronization
// included; CPU times are wall-clock on one thread. Each is the median of `repeats` after
// `warmup` runs, every run starting from the same state.
//
// The library prints nothing; the caller prints and writes the results.
#ifndef SLUICE_BENCH_GPU_MEMORY_BENCH_H_
#define SLUICE_BENCH_GPU_MEMORY_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace sluice::bench {

struct MemoryBenchOptions {
  std::vector<int> batches = {8, 16, 32, 64, 128, 256};  // sequences per decode step
  int layers = 32;
  int kv_heads = 8;
  int head_dim = 128;
  // The page format: this preset's high tier (kvstore/kv_preset.h), with token scores and
  // positions in the page as LeanKV's unified pages have them.
  std::string preset = "leankv-k8v4";
  int page_bytes = 16 * 1024;
  bool token_meta = true;
  int context = 1024;  // tokens written to each page list
  // (a): the fraction of page lists whose last page is full and that open a page this step.
  double new_page_fraction = 1.0 / 16;
  // (b): the fraction of page lists compacted this step, and the fraction of each one's slots
  // evicted (uniformly at random) since its last compaction.
  double compact_fraction = 1.0 / 16;
  double evicted_fraction = 0.25;
  int warmup = 2;
  int repeats = 10;
  uint64_t seed = 1;
  bool gpu = true;  // false: CPU columns only (the gpu_* fields are null)
  bool cpu = true;  // false: GPU columns only (the cpu_* fields are null)
};

// One row per batch size:
//   {batch, page_lists, pages_allocated, lists, moves, pages_freed, slots_per_page,
//    gpu_alloc_us, gpu_compact_us, cpu_alloc_us, cpu_compact_us}
// `lists` is the number of page lists compacted, `moves` the slots they move, `pages_freed`
// the pages the compaction frees. With both sides run, the GPU's moves and freed pages are
// checked against the CPU's (Internal error if they differ). InvalidArgument for bad options,
// Unavailable (with CUDA's reason) when `gpu` is set and there is no device.
absl::StatusOr<nlohmann::json> RunMemoryBench(const MemoryBenchOptions& options);

}  // namespace sluice::bench

#endif  // SLUICE_BENCH_GPU_MEMORY_BENCH_H_
