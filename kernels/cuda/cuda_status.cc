#include "kernels/cuda/cuda_status.h"

#include "absl/strings/str_format.h"

namespace sluice::kernels::cuda {

absl::Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrFormat("%s failed at %s:%d: %s (%s)", expr, file, line,
                                              cudaGetErrorString(err), cudaGetErrorName(err));
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace sluice::kernels::cuda
