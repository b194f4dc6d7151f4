// Internal to gpu_page_allocator: the kernels and CUB scans of the device page list, as launch
// functions that enqueue work on a stream and return the launch error. No absl here: nvcc
// compiles this header. Parameters must be valid; GpuPageAllocator checks them.
#ifndef SLUICE_KVSTORE_MEMORY_CUDA_GPU_PAGE_ALLOCATOR_KERNELS_H_
#define SLUICE_KVSTORE_MEMORY_CUDA_GPU_PAGE_ALLOCATOR_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sluice::kvstore::cuda {

// Errors a batch kernel found, as the smallest offending index of each kind (kNoError if none).
struct DeviceBatchErrors {
  unsigned long long out_of_range;  // an id outside [0, num_pages)
  unsigned long long bad_refcount;  // Free: dropped below 0 (double free); Retain: was 0 (free)
  unsigned long long overflow;      // Retain: a refcount was already INT32_MAX
};
inline constexpr unsigned long long kNoError = ~0ull;  // what a 0xff memset writes

// The device state of the circular free page list.
struct DevicePageList {
  int32_t* free_list;  // [num_pages] page ids; the free ones from start, circularly
  int32_t* refcount;   // [num_pages] 0 = free
  int32_t* last;       // [num_pages] scratch for Free, -1 between calls
  int64_t num_pages;
};

// Allocation: ids[j] = free_list[(start + j) % num_pages] and its refcount becomes 1, for
// j < total. The pages of request i are ids[offsets[i], offsets[i + 1]).
cudaError_t LaunchTakePages(DevicePageList list, int64_t start, int64_t total,
                            int32_t* ids,  // [total]
                            cudaStream_t stream);

// Free, first pass: drops one reference per listed id and records the errors, and each id's last
// index in the list in `last`.
cudaError_t LaunchDropReferences(DevicePageList list, const int32_t* ids,  // [n]
                                 int64_t n, DeviceBatchErrors* errors, cudaStream_t stream);

// Free, second pass: zero_flags[k] = 1 where ids[k] is the occurrence that took its page's
// refcount to zero (its last occurrence), else 0; zero_flags[n] = 0.
cudaError_t LaunchFlagFreed(DevicePageList list, const int32_t* ids,  // [n]
                            int64_t n,
                            int32_t* zero_flags,  // [n + 1]
                            cudaStream_t stream);

// Free, last pass when there was no error: writes each flagged id at
// free_list[(end + offsets[k]) % num_pages] and resets `last`.
cudaError_t LaunchRecycle(DevicePageList list, const int32_t* ids,  // [n]
                          int64_t n,
                          const int32_t* zero_flags,  // [n]
                          const int64_t* offsets,     // [n] exclusive scan of zero_flags
                          int64_t end, cudaStream_t stream);

// Undoes LaunchDropReferences (adds the references back, resets `last`) after an error.
cudaError_t LaunchRestoreReferences(DevicePageList list, const int32_t* ids,  // [n]
                                    int64_t n, cudaStream_t stream);

// Retain: adds one reference per listed id (in range) and records the errors; with `undo`,
// drops them again instead (the rollback after an error) and records nothing.
cudaError_t LaunchAddReferences(DevicePageList list, const int32_t* ids,  // [n]
                                int64_t n, bool undo, DeviceBatchErrors* errors,
                                cudaStream_t stream);

}  // namespace sluice::kvstore::cuda

#endif  // SLUICE_KVSTORE_MEMORY_CUDA_GPU_PAGE_ALLOCATOR_KERNELS_H_
