#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/skinny_matmul.h"

namespace sluice::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarp * kWarpsPerBlock;
constexpr int kFeatures = 4;  // output features (weight rows) per block
constexpr int kRows = 8;      // rows of x per pass
constexpr int kSlice = 8;     // elements of k per lane and step: one 16-byte load of bf16

__device__ __forceinline__ float Bf16Lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// grid: [ceil(n / kFeatures)], block: [kThreads]. Block b owns features [f0, f0 + kFeatures),
// f0 = b * kFeatures; thread t takes the k slices t, t + kThreads, ... (split four ways over the
// warps, so a row of k = 576 is one step of loads). For each pass of up to kRows rows of x:
// acc[r][f] += x[r, slice] . w[f, slice] over the thread's slices, a butterfly sum over the warp
// (lane r * kFeatures + f keeps (r, f)), the four warps' sums added through shared memory, and
// lane (r, f) of warp 0 writes y[r, f].
__global__ void __launch_bounds__(kThreads)
    SkinnyMatmulKernel(const float* __restrict__ x,     // [m, k]
                       const uint16_t* __restrict__ w,  // [n, k] bf16
                       float* __restrict__ y,           // [m, n]
                       int64_t m, int64_t n, int64_t k, bool accumulate) {
  SLUICE_SHARED(partial, float[kWarpsPerBlock][kWarp]);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t f0 = int64_t{blockIdx.x} * kFeatures;
  const int64_t slices = k / kSlice;
  // Rows of w past n read row n - 1 again (in bounds); their sums are never written.
  const uint4* wrow[kFeatures];
#pragma unroll
  for (int f = 0; f < kFeatures; ++f) {
    const int64_t row = f0 + f < n ? f0 + f : n - 1;
    wrow[f] = reinterpret_cast<const uint4*>(w + row * k);
  }
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    float acc[kRows][kFeatures] = {};
    for (int64_t s = threadIdx.x; s < slices; s += kThreads) {
      float wf[kFeatures][kSlice];
#pragma unroll
      for (int f = 0; f < kFeatures; ++f) {
        const uint4 v = __ldg(wrow[f] + s);
        wf[f][0] = Bf16Lo(v.x), wf[f][1] = Bf16Hi(v.x), wf[f][2] = Bf16Lo(v.y);
        wf[f][3] = Bf16Hi(v.y), wf[f][4] = Bf16Lo(v.z), wf[f][5] = Bf16Hi(v.z);
        wf[f][6] = Bf16Lo(v.w), wf[f][7] = Bf16Hi(v.w);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r0 + r < m) {
          const float4* xr = reinterpret_cast<const float4*>(x + (r0 + r) * k) + 2 * s;
          const float4 a = __ldg(xr), b = __ldg(xr + 1);
          const float xs[kSlice] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
          for (int f = 0; f < kFeatures; ++f) {
#pragma unroll
            for (int e = 0; e < kSlice; ++e) acc[r][f] = fmaf(xs[e], wf[f][e], acc[r][f]);
          }
        }
      }
    }
    // Every lane ends with every sum of its warp; lane r * kFeatures + f keeps (r, f).
    float mine = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int f = 0; f < kFeatures; ++f) {
        float v = acc[r][f];
#pragma unroll
        for (int offset = kWarp / 2; offset > 0; offset /= 2) {
          v += __shfl_xor_sync(0xffffffffu, v, offset);
        }
        if (lane == r * kFeatures + f) mine = v;
      }
    }
    partial[warp][lane] = mine;
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int other = 1; other < kWarpsPerBlock; ++other) mine += partial[other][lane];
      const int64_t row = r0 + lane / kFeatures, feature = f0 + lane % kFeatures;
      if (row < m && feature < n) {
        float* out = y + row * n + feature;
        *out = accumulate ? *out + mine : mine;
      }
    }
    __syncthreads();  // the next pass rewrites partial
  }
}

}  // namespace

bool SkinnyMatmulApplies(const SkinnyMatmulParams& p) {
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return p.m >= 1 && p.m <= kSkinnyMaxRows && p.n >= 1 && p.k >= kSlice && p.k % kSlice == 0 &&
         aligned(p.x) && aligned(p.w);
}

cudaError_t LaunchSkinnyMatmul(const SkinnyMatmulParams& p, cudaStream_t stream) {
  static_assert(kRows * kFeatures == kWarp, "a pass's sums are one per lane");
  if (!SkinnyMatmulApplies(p)) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((p.n + kFeatures - 1) / kFeatures);
  SLUICE_LAUNCH(blocks, kThreads, 0, stream, SkinnyMatmulKernel)
  (p.x, p.w, p.y, p.m, p.n, p.k, p.accumulate);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
