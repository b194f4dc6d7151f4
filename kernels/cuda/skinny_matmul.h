// y (+)= x w^T for a few rows of x against bf16 weights: a decode step's projections at small
// batches. cuBLAS spends more host time choosing and launching a GEMM of 1-16 rows (and the
// bf16 path one more launch converting x) than the GPU spends reading the weights, so these
// products take one launch of their own: each block reads its weight rows once with 16-byte
// loads, x in fp32 straight from memory (no rounding of x), fp32 accumulation. No absl here:
// nvcc compiles this header.
#ifndef SLUICE_KERNELS_CUDA_SKINNY_MATMUL_H_
#define SLUICE_KERNELS_CUDA_SKINNY_MATMUL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sluice::kernels::cuda {

// The most rows of x one launch takes; past this cuBLAS's GEMM is the faster path.
constexpr int64_t kSkinnyMaxRows = 16;

struct SkinnyMatmulParams {
  const float* x = nullptr;     // [m, k], 16-byte aligned
  const uint16_t* w = nullptr;  // [n, k] bf16, 16-byte aligned
  float* y = nullptr;           // [m, n]
  int64_t m = 0;                // in [1, kSkinnyMaxRows]
  int64_t n = 0;
  int64_t k = 0;  // a multiple of 8
  bool accumulate = false;
};

// Whether LaunchSkinnyMatmul takes `p`: the row count, k and the alignments above.
bool SkinnyMatmulApplies(const SkinnyMatmulParams& p);

// Enqueues the product on `stream`: grid [ceil(n / 4)], 128 threads. Each block owns 4
// consecutive output features, its threads split k: per 8-element slice of k a thread loads the
// 4 weight slices once and multiplies them with every row of x, 8 rows a pass.
cudaError_t LaunchSkinnyMatmul(const SkinnyMatmulParams& p, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_SKINNY_MATMUL_H_
