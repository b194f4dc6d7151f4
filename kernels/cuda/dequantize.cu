#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/dequantize.h"
#include "kernels/cuda/ggml_dequant.cuh"
#include "kernels/cuda/launch.cuh"

namespace sluice::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride beyond this

// grid-stride over rows * cols elements; consecutive threads write consecutive floats.
__device__ __forceinline__ void Store(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* dst, float v) {
  *dst = __float2bfloat16_rn(v);
}

template <GgmlType kType, typename Out>
__global__ void __launch_bounds__(kThreads)
    DequantizeRowsKernel(const uint8_t* __restrict__ src,  // [rows, row_bytes]
                         int64_t rows, int64_t cols,
                         Out* __restrict__ dst) {  // [rows, cols]
  const int64_t total = rows * cols;
  const int64_t row_bytes = GgmlRowBytes<kType>(cols);
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / cols, c = i % cols;
    Store(dst + i, DequantElement<kType>(src + r * row_bytes, c));
  }
}

template <typename Out>
cudaError_t Launch(GgmlType type, const void* src, int64_t rows, int64_t cols, Out* dst,
                   cudaStream_t stream) {
  const int64_t total = rows * cols;
  if (total == 0) return cudaSuccess;
  const unsigned blocks =
      static_cast<unsigned>(std::min(kMaxBlocks, (total + kThreads - 1) / kThreads));
  const bool known = DispatchGgmlType(type, [&](auto t) {
    SLUICE_LAUNCH(blocks, kThreads, 0, stream, DequantizeRowsKernel<decltype(t)::value, Out>)
    (static_cast<const uint8_t*>(src), rows, cols, dst);
  });
  if (!known) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchDequantizeRows(GgmlType type, const void* src, int64_t rows, int64_t cols,
                                 float* dst, cudaStream_t stream) {
  return Launch(type, src, rows, cols, dst, stream);
}

cudaError_t LaunchDequantizeRowsBf16(GgmlType type, const void* src, int64_t rows, int64_t cols,
                                     uint16_t* dst, cudaStream_t stream) {
  return Launch(type, src, rows, cols, reinterpret_cast<__nv_bfloat16*>(dst), stream);
}

}  // namespace sluice::kernels::cuda
