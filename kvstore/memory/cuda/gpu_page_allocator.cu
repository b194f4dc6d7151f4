// Kernels of the device circular free page list (see gpu_page_allocator.h). One thread per page
// or per listed id; grids are grid-stride loops so any batch size fits one launch.
#include <climits>

#include "kernels/cuda/launch.cuh"
#include "kvstore/memory/cuda/gpu_page_allocator_kernels.h"

namespace sluice::kvstore::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride loops cover the rest

dim3 GridFor(int64_t items) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks)));
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__device__ __forceinline__ bool InRange(int32_t id, int64_t num_pages) {
  return id >= 0 && id < num_pages;
}

__global__ void TakePagesKernel(DevicePageList list, int64_t start, int64_t total,
                                int32_t* __restrict__ ids) {  // [total]
  for (int64_t j = GlobalThread(); j < total; j += GridThreads()) {
    int64_t at = start + j;
    if (at >= list.num_pages) at -= list.num_pages;  // start < num_pages and total <= num_pages
    const int32_t id = list.free_list[at];
    ids[j] = id;
    list.refcount[id] = 1;  // ids in the free region are distinct: no race
  }
}

__global__ void DropReferencesKernel(DevicePageList list, const int32_t* __restrict__ ids,  // [n]
                                     int64_t n, DeviceBatchErrors* errors) {
  for (int64_t k = GlobalThread(); k < n; k += GridThreads()) {
    const int32_t id = ids[k];
    if (!InRange(id, list.num_pages)) {
      atomicMin(&errors->out_of_range, static_cast<unsigned long long>(k));
      continue;
    }
    const int old = atomicSub(&list.refcount[id], 1);
    if (old <= 0) atomicMin(&errors->bad_refcount, static_cast<unsigned long long>(k));
    atomicMax(&list.last[id], static_cast<int>(k));  // n <= INT32_MAX, checked by the host
  }
}

__global__ void FlagFreedKernel(DevicePageList list, const int32_t* __restrict__ ids,  // [n]
                                int64_t n, int32_t* __restrict__ zero_flags) {         // [n + 1]
  for (int64_t k = GlobalThread(); k <= n; k += GridThreads()) {
    int32_t flag = 0;
    if (k < n) {
      const int32_t id = ids[k];
      flag = InRange(id, list.num_pages) && list.refcount[id] == 0 && list.last[id] == k;
    }
    zero_flags[k] = flag;
  }
}

__global__ void RecycleKernel(DevicePageList list, const int32_t* __restrict__ ids,  // [n]
                              int64_t n, const int32_t* __restrict__ zero_flags,     // [n]
                              const int64_t* __restrict__ offsets,                   // [n]
                              int64_t end) {
  for (int64_t k = GlobalThread(); k < n; k += GridThreads()) {
    const int32_t id = ids[k];
    if (!InRange(id, list.num_pages)) continue;  // cannot happen: errors stop before this pass
    if (zero_flags[k]) {
      // end < num_pages and offsets[k] < pages freed <= used pages: one wrap at most.
      int64_t at = end + offsets[k];
      if (at >= list.num_pages) at -= list.num_pages;
      list.free_list[at] = id;
    }
    // Every occurrence of the id writes the same value, but concurrent plain stores to one
    // address are a data race in CUDA's memory model: an atomic store.
    atomicExch(&list.last[id], -1);
  }
}

__global__ void RestoreReferencesKernel(DevicePageList list,
                                        const int32_t* __restrict__ ids,  // [n]
                                        int64_t n) {
  for (int64_t k = GlobalThread(); k < n; k += GridThreads()) {
    const int32_t id = ids[k];
    if (!InRange(id, list.num_pages)) continue;
    atomicAdd(&list.refcount[id], 1);
    atomicExch(&list.last[id], -1);  // an id may occur more than once: atomic, as above
  }
}

__global__ void AddReferencesKernel(DevicePageList list, const int32_t* __restrict__ ids,  // [n]
                                    int64_t n, bool undo, DeviceBatchErrors* errors) {
  for (int64_t k = GlobalThread(); k < n; k += GridThreads()) {
    const int32_t id = ids[k];
    if (!InRange(id, list.num_pages)) {
      if (!undo) atomicMin(&errors->out_of_range, static_cast<unsigned long long>(k));
      continue;
    }
    if (undo) {
      atomicSub(&list.refcount[id], 1);
      continue;
    }
    // Wraps to INT_MIN at INT_MAX (two's complement); the undo pass brings it back.
    const int old = atomicAdd(&list.refcount[id], 1);
    if (old == 0) atomicMin(&errors->bad_refcount, static_cast<unsigned long long>(k));
    if (old == INT_MAX) atomicMin(&errors->overflow, static_cast<unsigned long long>(k));
  }
}

}  // namespace

cudaError_t LaunchTakePages(DevicePageList list, int64_t start, int64_t total, int32_t* ids,
                            cudaStream_t stream) {
  if (total <= 0) return cudaSuccess;
  SLUICE_LAUNCH(GridFor(total), kThreads, 0, stream, TakePagesKernel)(list, start, total, ids);
  return cudaGetLastError();
}

cudaError_t LaunchDropReferences(DevicePageList list, const int32_t* ids, int64_t n,
                                 DeviceBatchErrors* errors, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  SLUICE_LAUNCH(GridFor(n), kThreads, 0, stream, DropReferencesKernel)(list, ids, n, errors);
  return cudaGetLastError();
}

cudaError_t LaunchFlagFreed(DevicePageList list, const int32_t* ids, int64_t n, int32_t* zero_flags,
                            cudaStream_t stream) {
  SLUICE_LAUNCH(GridFor(n + 1), kThreads, 0, stream, FlagFreedKernel)(list, ids, n, zero_flags);
  return cudaGetLastError();
}

cudaError_t LaunchRecycle(DevicePageList list, const int32_t* ids, int64_t n,
                          const int32_t* zero_flags, const int64_t* offsets, int64_t end,
                          cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  SLUICE_LAUNCH(GridFor(n), kThreads, 0, stream, RecycleKernel)
  (list, ids, n, zero_flags, offsets, end);
  return cudaGetLastError();
}

cudaError_t LaunchRestoreReferences(DevicePageList list, const int32_t* ids, int64_t n,
                                    cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  SLUICE_LAUNCH(GridFor(n), kThreads, 0, stream, RestoreReferencesKernel)(list, ids, n);
  return cudaGetLastError();
}

cudaError_t LaunchAddReferences(DevicePageList list, const int32_t* ids, int64_t n, bool undo,
                                DeviceBatchErrors* errors, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  SLUICE_LAUNCH(GridFor(n), kThreads, 0, stream, AddReferencesKernel)(list, ids, n, undo, errors);
  return cudaGetLastError();
}

}  // namespace sluice::kvstore::cuda
