#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/launch.cuh"

namespace sluice::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride beyond this

// grid-stride over n. Each element is read before it is written, so out may alias gate or up
// (hence no __restrict__).
__global__ void __launch_bounds__(kThreads) SwiGluKernel(const float* gate,  // [n]
                                                         const float* up,    // [n]
                                                         float* out,         // [n]
                                                         int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <typename Op>
__device__ __forceinline__ float WarpReduce(float v, Op op) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Reduces over the block and returns the result to every thread. `shared` holds one float per
// warp; it may be reused by the next call (the trailing barrier orders the reads before it).
template <typename Op>
__device__ float BlockReduce(float v, float identity, Op op, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = WarpReduce(v, op);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = threadIdx.x < warps ? shared[threadIdx.x] : identity;
  if (warp == 0) v = WarpReduce(v, op);
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  const float result = shared[0];
  __syncthreads();
  return result;
}

// grid: [rows], block: [threads] (a power of two, 32..1024). Three sweeps over the row: max, sum
// of exponentials, normalized write; the row stays in L1/L2 between them.
__global__ void SoftmaxKernel(float* x,  // [rows, cols]
                              int64_t cols) {
  SLUICE_SHARED(shared, float[kWarp]);
  float* xr = x + blockIdx.x * cols;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, xr[c]);
  mx = BlockReduce(mx, -INFINITY, MaxOp{}, shared);
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(xr[c] - mx);
  sum = BlockReduce(sum, 0.f, SumOp{}, shared);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) xr[c] = expf(xr[c] - mx) / sum;
}

}  // namespace

cudaError_t LaunchSwiGlu(const SwiGluParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const unsigned blocks =
      static_cast<unsigned>(std::min(kMaxBlocks, (p.n + kThreads - 1) / kThreads));
  SLUICE_LAUNCH(blocks, kThreads, 0, stream, SwiGluKernel)(p.gate, p.up, p.out, p.n);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmax(const SoftmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  int threads = 1024;
  while (threads > kWarp && threads / 2 >= p.cols) threads /= 2;
  SLUICE_LAUNCH(static_cast<unsigned>(p.rows), threads, 0, stream, SoftmaxKernel)(p.x, p.cols);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
