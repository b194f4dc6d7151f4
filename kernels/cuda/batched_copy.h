// Many device-to-device copies in one launch: Backend::CopyOnDevice on CUDA (a decode step writes
// two small window rows per sequence and layer; one cudaMemcpyAsync each costs a few
// microseconds of host time, one launch for all of them costs one). Launch functions enqueue work
// on a stream and return the launch error. No absl here: nvcc compiles this header.
#ifndef SLUICE_KERNELS_CUDA_BATCHED_COPY_H_
#define SLUICE_KERNELS_CUDA_BATCHED_COPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sluice::kernels::cuda {

struct CopyRange {
  void* dst;
  const void* src;
  uint64_t bytes;
};

// The ranges travel as the kernel's parameter (3 KiB, under the 4 KiB every toolkit allows), so
// a launch needs no upload and no host buffer that must outlive it.
constexpr int kMaxCopiesPerLaunch = 128;

struct BatchedCopyParams {
  CopyRange ranges[kMaxCopiesPerLaunch];  // [count]; no two overlap
  int32_t count = 0;                      // in [1, kMaxCopiesPerLaunch]
};

// Enqueues the copies on `stream`: grid [count, blocks_per_copy], 256 threads a block; 16-byte
// accesses where a range's ends and length allow, 4-byte or single bytes otherwise.
cudaError_t LaunchBatchedCopy(const BatchedCopyParams& p, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_BATCHED_COPY_H_
