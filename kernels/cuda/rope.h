// CUDA rotary position embedding, in place, both pairings (adjacent and NeoX), partial rotary
// dims. Angles and rotations are computed in fp64: positions reach thousands of radians, where
// an fp32 angle would be off by 1e-3.
#ifndef SLUICE_KERNELS_CUDA_ROPE_H_
#define SLUICE_KERNELS_CUDA_ROPE_H_

#include <cuda_runtime_api.h>

#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// Enqueues RoPE on `stream`; parameters must be valid, x and positions in device memory.
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_ROPE_H_
