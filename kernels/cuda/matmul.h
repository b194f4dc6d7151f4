// CUDA matmul, y = x * w^T, through cuBLAS.
//
// MatmulPrecision::kFp32 (the default) is exact fp32 arithmetic, as the host backends: fp32
// weights go to cublasSgemm as they are, and every other type (f16, bf16, q8_0, q4_0, q4_1) is
// first expanded to fp32 by a dequantization kernel, a chunk of rows at a time, into a device
// workspace the caller owns, then multiplied by cublasSgemm. The handle runs in pedantic math
// mode so that neither TF32 tensor cores nor bf16x9 emulation replace the fp32 arithmetic.
// MatmulPrecision::kBf16 rounds x and the expanded weights to bf16 and multiplies them on the
// tensor cores (cublasGemmEx, fp32 accumulation): the serving path. There, bf16 weights against
// at most kSkinnyMaxRows rows of x (a decode step) take one launch of skinny_matmul.h instead.
#ifndef SLUICE_KERNELS_CUDA_MATMUL_H_
#define SLUICE_KERNELS_CUDA_MATMUL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// Device workspace bytes Matmul needs for `p`: 0 for fp32 weights, otherwise one chunk of
// expanded rows (at most 128 MiB, at least one row).
size_t MatmulWorkspaceBytes(const MatmulParams& p);

// Enqueues the product on `stream`, which must be the stream `cublas` is bound to. `p` is valid
// (Backend::Matmul checked it) with device pointers; `workspace` holds MatmulWorkspaceBytes(p)
// bytes of device memory. UnimplementedError for m, n or k beyond cuBLAS's 32-bit sizes.
absl::Status Matmul(const MatmulParams& p, cublasHandle_t cublas, float* workspace,
                    cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_MATMUL_H_
