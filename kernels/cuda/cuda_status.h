// Turns CUDA runtime errors into absl::Status at the lowest layer, with the failing call and
// its file and line, so nothing above this sees a cudaError_t.
#ifndef SLUICE_KERNELS_CUDA_CUDA_STATUS_H_
#define SLUICE_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace sluice::kernels::cuda {

// OK for cudaSuccess; otherwise an error (Unavailable for missing device or driver, Internal
// for the rest) naming `expr`, `file`:`line` and CUDA's description.
absl::Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace sluice::kernels::cuda

#define SLUICE_CUDA_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                         \
    const cudaError_t sluice_cuda_err_ = (expr);                                               \
    if (sluice_cuda_err_ != cudaSuccess) {                                                     \
      return ::sluice::kernels::cuda::CudaStatus(sluice_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                                          \
  } while (0)

#endif  // SLUICE_KERNELS_CUDA_CUDA_STATUS_H_
