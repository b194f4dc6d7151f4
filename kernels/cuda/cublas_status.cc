#include "kernels/cuda/cublas_status.h"

#include <string>

#include "absl/strings/str_format.h"

namespace sluice::kernels::cuda {

absl::Status CublasStatus(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrFormat("%s failed at %s:%d: %s (%s)", expr, file, line,
                      cublasGetStatusString(status), cublasGetStatusName(status));
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::UnavailableError(message);
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_LICENSE_ERROR:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace sluice::kernels::cuda
