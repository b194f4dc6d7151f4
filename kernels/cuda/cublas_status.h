// Turns cuBLAS status codes into absl::Status at the lowest layer, with the failing call and its
// file and line, as cuda_status.h does for the CUDA runtime.
#ifndef SLUICE_KERNELS_CUDA_CUBLAS_STATUS_H_
#define SLUICE_KERNELS_CUDA_CUBLAS_STATUS_H_

#include <cublas_v2.h>

#include "absl/status/status.h"

namespace sluice::kernels::cuda {

// OK for CUBLAS_STATUS_SUCCESS; otherwise an error naming `expr`, `file`:`line` and cuBLAS's
// description: Unavailable when the library could not initialize (no device or driver),
// ResourceExhausted for allocation failures, InvalidArgument for bad parameters, Unimplemented
// for features the device or build lacks, Internal for the rest.
absl::Status CublasStatus(cublasStatus_t status, const char* expr, const char* file, int line);

}  // namespace sluice::kernels::cuda

#define SLUICE_CUBLAS_RETURN_IF_ERROR(expr)                                                \
  do {                                                                                     \
    const cublasStatus_t sluice_cublas_status_ = (expr);                                   \
    if (sluice_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                  \
      return ::sluice::kernels::cuda::CublasStatus(sluice_cublas_status_, #expr, __FILE__, \
                                                   __LINE__);                              \
    }                                                                                      \
  } while (0)

#endif  // SLUICE_KERNELS_CUDA_CUBLAS_STATUS_H_
