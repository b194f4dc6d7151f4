#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace sluice::kernels::cuda {
namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, broadcast to every thread. `shared` holds one float per warp.
__device__ float BlockSum(float v, float* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = WarpSum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = threadIdx.x < warps ? shared[threadIdx.x] : 0.f;
  if (warp == 0) v = WarpSum(v);
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  return shared[0];
}

// grid: [rows], block: [threads]; VEC floats per load (1 or 4).
template <int VEC>
__global__ void RmsNormKernel(const float* __restrict__ x,       // [rows, dim]
                              const float* __restrict__ weight,  // [dim]
                              float* y,                          // [rows, dim]
                              int64_t dim, float eps) {
  SLUICE_SHARED(shared, float[kWarp]);
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  const int64_t nvec = dim / VEC;

  float acc = 0.f;
  if constexpr (VEC == 4) {
    const float4* xv = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const float4 v = xv[i];
      acc += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) acc += xr[i] * xr[i];
  }
  const float ss = BlockSum(acc, shared);
  const float scale = rsqrtf(ss / static_cast<float>(dim) + eps);

  if constexpr (VEC == 4) {
    const float4* xv = reinterpret_cast<const float4*>(xr);
    const float4* wv = reinterpret_cast<const float4*>(weight);
    float4* yv = reinterpret_cast<float4*>(yr);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      const float4 v = xv[i];
      const float4 w = wv[i];
      yv[i] =
          make_float4(v.x * scale * w.x, v.y * scale * w.y, v.z * scale * w.z, v.w * scale * w.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * weight[i];
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  const bool vec4 = p.dim % 4 == 0 && Aligned16(p.x) && Aligned16(p.y) && Aligned16(p.weight);
  const int64_t work = vec4 ? p.dim / 4 : p.dim;
  int threads = 1024;
  while (threads > kWarp && threads / 2 >= work) threads /= 2;
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (vec4) {
    SLUICE_LAUNCH(grid, threads, 0, stream, RmsNormKernel<4>)(p.x, p.weight, p.y, p.dim, p.eps);
  } else {
    SLUICE_LAUNCH(grid, threads, 0, stream, RmsNormKernel<1>)(p.x, p.weight, p.y, p.dim, p.eps);
  }
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
