// CUDA elementwise and row-wise activations: SwiGLU (in place over gate or up allowed) and
// softmax over rows, in place. fp32 with the accurate expf (no fast-math intrinsics).
#ifndef SLUICE_KERNELS_CUDA_ACTIVATION_H_
#define SLUICE_KERNELS_CUDA_ACTIVATION_H_

#include <cuda_runtime_api.h>

#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// Enqueue on `stream`; parameters must be valid, data pointers in device memory.
cudaError_t LaunchSwiGlu(const SwiGluParams& p, cudaStream_t stream);
// One thread block per row: rows <= 2^31 - 1.
cudaError_t LaunchSoftmax(const SoftmaxParams& p, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_ACTIVATION_H_
