// CUDA RMSNorm: one thread block per row, vectorized loads when rows are 16-byte aligned.
#ifndef SLUICE_KERNELS_CUDA_RMSNORM_H_
#define SLUICE_KERNELS_CUDA_RMSNORM_H_

#include <cuda_runtime_api.h>

#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// Enqueues RMSNorm on `stream`; parameters must be valid and point to device memory.
// Returns the launch error, if any (execution errors surface at the next synchronization).
cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_RMSNORM_H_
