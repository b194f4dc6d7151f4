#include "kernels/cuda/matmul.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cublas_status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequantize.h"
#include "kernels/cuda/skinny_matmul.h"

namespace sluice::kernels::cuda {
namespace {

// Expanded weights per chunk: large enough that each SGEMM is big, small enough that a
// 128k-row output projection does not need gigabytes of scratch.
constexpr int64_t kMaxChunkBytes = int64_t{128} << 20;

bool Bf16(const MatmulParams& p) { return p.precision == MatmulPrecision::kBf16; }

SkinnyMatmulParams Skinny(const MatmulParams& p) {
  return {.x = p.x,
          .w = static_cast<const uint16_t*>(p.w),
          .y = p.y,
          .m = p.m,
          .n = p.n,
          .k = p.k,
          .accumulate = p.accumulate};
}

// The bf16 path's few rows against bf16 weights: the skinny kernel, no workspace.
bool SkinnyApplies(const MatmulParams& p) {
  return Bf16(p) && p.w_type == GgmlType::kBF16 && SkinnyMatmulApplies(Skinny(p));
}

int64_t ChunkRows(const MatmulParams& p) {
  const int64_t row_bytes = p.k * (Bf16(p) ? 2 : 4);
  return std::clamp<int64_t>(kMaxChunkBytes / row_bytes, 1, p.n);
}

// The bf16 path: x and each chunk of w rounded to bf16 in the workspace ([m, k] then
// [chunk, k]), multiplied on the tensor cores with fp32 accumulation (cublasGemmEx). Weights
// stored in bf16 are read in place: one GEMM, only x converted; against a few rows of x
// (SkinnyMatmulApplies) they take the skinny kernel instead, x unrounded.
absl::Status MatmulBf16(const MatmulParams& p, cublasHandle_t cublas, void* workspace,
                        cudaStream_t stream) {
  if (SkinnyApplies(p)) {
    SLUICE_CUDA_RETURN_IF_ERROR(LaunchSkinnyMatmul(Skinny(p), stream));
    return absl::OkStatus();
  }
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const float one = 1.f, beta = p.accumulate ? 1.f : 0.f;
  uint16_t* x16 = static_cast<uint16_t*>(workspace);
  uint16_t* w16 = x16 + p.m * p.k;
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchDequantizeRowsBf16(GgmlType::kF32, p.x, p.m, p.k, x16, stream));
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  const int64_t row_bytes = p.k / t->block_size * t->type_size;
  const int64_t chunk = ChunkRows(p);
  // The handle stays in pedantic mode for the fp32 path; bf16 operands are what this path
  // prescribes, so the default mode (tensor cores) is set around the call and restored.
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));
  absl::Status status;
  if (p.w_type == GgmlType::kBF16) {
    status = CublasStatus(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, p.w,
                                       CUDA_R_16BF, k, x16, CUDA_R_16BF, k, &beta, p.y, CUDA_R_32F,
                                       n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx", __FILE__, __LINE__);
  }
  for (int64_t n0 = 0; p.w_type != GgmlType::kBF16 && n0 < p.n && status.ok(); n0 += chunk) {
    const int nc = static_cast<int>(std::min(chunk, p.n - n0));
    if (cudaError_t e = LaunchDequantizeRowsBf16(
            p.w_type, static_cast<const uint8_t*>(p.w) + n0 * row_bytes, nc, p.k, w16, stream);
        e != cudaSuccess) {
      status = CudaStatus(e, "LaunchDequantizeRowsBf16", __FILE__, __LINE__);
      break;
    }
    status = CublasStatus(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, nc, m, k, &one, w16,
                                       CUDA_R_16BF, k, x16, CUDA_R_16BF, k, &beta, p.y + n0,
                                       CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx", __FILE__, __LINE__);
  }
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(cublas, CUBLAS_PEDANTIC_MATH));
  return status;
}

}  // namespace

size_t MatmulWorkspaceBytes(const MatmulParams& p) {
  if (SkinnyApplies(p)) return 0;
  if (Bf16(p)) {
    return static_cast<size_t>((p.m + (p.w_type == GgmlType::kBF16 ? 0 : ChunkRows(p))) * p.k) * 2;
  }
  if (p.w_type == GgmlType::kF32) return 0;
  return static_cast<size_t>(ChunkRows(p) * p.k) * sizeof(float);
}

absl::Status Matmul(const MatmulParams& p, cublasHandle_t cublas, float* workspace,
                    cudaStream_t stream) {
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (p.m > kMaxInt || p.n > kMaxInt || p.k > kMaxInt) {
    return absl::UnimplementedError(absl::StrFormat(
        "matmul: m=%d n=%d k=%d exceeds cuBLAS's 32-bit sizes on the CUDA backend", p.m, p.n, p.k));
  }
  if (Bf16(p)) return MatmulBf16(p, cublas, workspace, stream);
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const float one = 1.f, beta = p.accumulate ? 1.f : 0.f;
  // cuBLAS is column-major: y [m, n] row-major is C = y^T [n, m] with ldc = n; w [n, k]
  // row-major is a k x n column-major matrix, transposed to n x k; x [m, k] row-major is the
  // k x m column-major B. So C = op_T(w) * x.
  if (p.w_type == GgmlType::kF32) {
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one,
                                              static_cast<const float*>(p.w), k, p.x, k, &beta, p.y,
                                              n));
    return absl::OkStatus();
  }
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  const int64_t row_bytes = p.k / t->block_size * t->type_size;
  const int64_t chunk = ChunkRows(p);
  for (int64_t n0 = 0; n0 < p.n; n0 += chunk) {
    const int nc = static_cast<int>(std::min(chunk, p.n - n0));
    // The chunk's rows [n0, n0 + nc) of w, expanded, give rows [n0, n0 + nc) of C. The next
    // chunk's expansion overwrites the workspace only after this SGEMM ran: same stream.
    SLUICE_CUDA_RETURN_IF_ERROR(LaunchDequantizeRows(
        p.w_type, static_cast<const uint8_t*>(p.w) + n0 * row_bytes, nc, p.k, workspace, stream));
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, nc, m, k, &one,
                                              workspace, k, p.x, k, &beta, p.y + n0, n));
  }
  return absl::OkStatus();
}

}  // namespace sluice::kernels::cuda
