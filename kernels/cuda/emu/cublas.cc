#include "kernels/cuda/emu/cublas.h"

#include <algorithm>
#include <cstdio>

#include "kernels/cuda/emu/fp_types.h"
#include "kernels/cuda/emu/scheduler.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace sluice::emu {
namespace {

size_t ElementBytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

float Load(const void* base, cudaDataType t, int64_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(base)[i];
    case CUDA_R_16F:
      return HalfBitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case CUDA_R_16BF:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.f;
}

void Store(void* base, cudaDataType t, int64_t i, float v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(base)[i] = v;
      break;
    case CUDA_R_16F:
      static_cast<uint16_t*>(base)[i] = FloatToHalfBits(v);
      break;
    case CUDA_R_16BF:
      static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(v);
      break;
  }
}

bool KnownType(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

// The bytes a column-major rows x cols matrix with leading dimension ld spans.
size_t Span(int rows, int cols, int ld, size_t element) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * ld + rows) * element;
}

cublasStatus_t Gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, float alpha, const void* a, cudaDataType at, int lda, const void* b,
                    cudaDataType bt, int ldb, float beta, void* c, cudaDataType ct, int ldc,
                    const char* api) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
      m < 0 || n < 0 || k < 0 || lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m)) {
    std::fprintf(stderr,
                 "sluice emu: %s: bad arguments (op %d/%d, m=%d n=%d k=%d, lda=%d ldb=%d ldc=%d)\n",
                 api, ta, tb, m, n, k, lda, ldb, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!KnownType(at) || !KnownType(bt) || !KnownType(ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const size_t a_bytes =
      ta == CUBLAS_OP_N ? Span(m, k, lda, ElementBytes(at)) : Span(k, m, lda, ElementBytes(at));
  const size_t b_bytes =
      tb == CUBLAS_OP_N ? Span(k, n, ldb, ElementBytes(bt)) : Span(n, k, ldb, ElementBytes(bt));
  const size_t c_bytes = Span(m, n, ldc, ElementBytes(ct));
  if ((k > 0 && m > 0 && !CheckDeviceRange(a, a_bytes, api)) ||
      (k > 0 && n > 0 && !CheckDeviceRange(b, b_bytes, api)) ||
      (m > 0 && n > 0 && !CheckDeviceRange(c, c_bytes, api))) {
    // On a GPU this is an illegal address in the GEMM kernel: a fault of the context.
    Fault(std::string(api) + ": an operand is not device memory of the size its shape needs");
  }
  EnqueueDeviceWork(h->stream, [=] {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        float acc = 0.f;
        for (int l = 0; l < k; ++l) {
          const int64_t ai = ta == CUBLAS_OP_N ? i + int64_t{l} * lda : l + int64_t{i} * lda;
          const int64_t bi = tb == CUBLAS_OP_N ? l + int64_t{j} * ldb : j + int64_t{l} * ldb;
          acc += Load(a, at, ai) * Load(b, bt, bi);
        }
        const int64_t ci = i + int64_t{j} * ldc;
        const float prior = beta == 0.f ? 0.f : beta * Load(c, ct, ci);
        Store(c, ct, ci, alpha * acc + prior);
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace sluice::emu

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  cudaDeviceSynchronize();
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    default:
      return cublasGetStatusName(status);
  }
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* a, int lda, const float* b, int ldb, const float* beta,
                           float* c, int ldc) {
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return sluice::emu::Gemm(handle, transa, transb, m, n, k, *alpha, a, CUDA_R_32F, lda, b,
                           CUDA_R_32F, ldb, *beta, c, CUDA_R_32F, ldc, "cublasSgemm");
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType a_type, int lda, const void* b,
                            cudaDataType b_type, int ldb, const void* beta, void* c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  (void)algo;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return sluice::emu::Gemm(handle, transa, transb, m, n, k, *static_cast<const float*>(alpha), a,
                           a_type, lda, b, b_type, ldb, *static_cast<const float*>(beta), c, c_type,
                           ldc, "cublasGemmEx");
}
