#include <algorithm>
#include <cstdint>

#include "kernels/cuda/batched_copy.h"
#include "kernels/cuda/launch.cuh"

namespace sluice::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// A block moves at least this many bytes before the range gets another block.
constexpr uint64_t kBytesPerBlock = uint64_t{kThreads} * 16 * 8;
constexpr uint64_t kMaxBlocksPerCopy = 64;

// Elements [begin, end) of type T from src to dst, strided over the blocks of this range
// (blockIdx.y) and their threads.
template <typename T>
__device__ void CopyElements(T* __restrict__ dst, const T* __restrict__ src, uint64_t begin,
                             uint64_t end) {
  const uint64_t stride = uint64_t{gridDim.y} * blockDim.x;
  for (uint64_t i = begin + uint64_t{blockIdx.y} * blockDim.x + threadIdx.x; i < end; i += stride) {
    dst[i] = src[i];
  }
}

// grid: [count, blocks_per_copy], block: [kThreads]; blockIdx.x picks the range.
__global__ void __launch_bounds__(kThreads) BatchedCopyKernel(const BatchedCopyParams p) {
  const CopyRange r = p.ranges[blockIdx.x];
  auto* dst = static_cast<uint8_t*>(r.dst);
  const auto* src = static_cast<const uint8_t*>(r.src);
  const uintptr_t ends = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  uint64_t done = 0;  // bytes copied by the wide loops; single bytes take the rest
  if (ends % 16 == 0) {
    done = r.bytes / 16 * 16;
    CopyElements(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), 0, done / 16);
  } else if (ends % 4 == 0) {
    done = r.bytes / 4 * 4;
    CopyElements(reinterpret_cast<uint32_t*>(dst), reinterpret_cast<const uint32_t*>(src), 0,
                 done / 4);
  }
  CopyElements(dst, src, done, r.bytes);
}

}  // namespace

cudaError_t LaunchBatchedCopy(const BatchedCopyParams& p, cudaStream_t stream) {
  if (p.count < 1 || p.count > kMaxCopiesPerLaunch) return cudaErrorInvalidValue;
  uint64_t longest = 0;
  for (int i = 0; i < p.count; ++i) longest = std::max(longest, p.ranges[i].bytes);
  const uint64_t blocks =
      std::clamp<uint64_t>((longest + kBytesPerBlock - 1) / kBytesPerBlock, 1, kMaxBlocksPerCopy);
  SLUICE_LAUNCH(dim3(static_cast<unsigned>(p.count), static_cast<unsigned>(blocks)), kThreads, 0,
                stream, BatchedCopyKernel)
  (p);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
