// A kernel around kernels/cuda/warp_mma.cuh for its test: on the GPU it checks the fragment
// layout the emulation assumes against the tensor cores.
#ifndef SLUICE_KERNELS_CUDA_WARP_MMA_TESTING_H_
#define SLUICE_KERNELS_CUDA_WARP_MMA_TESTING_H_

#include <cuda_runtime_api.h>

namespace sluice::kernels::cuda {

// One warp: d[16][8] = c + a[16][16] b[16][8] (row-major device arrays, a and b rounded to fp16
// by PackHalf2) with MmaF16, then d[16][8] += (codes - 1024) for the f16x2 built by AndOr and
// SubHalf2 from `words` (16 x 8 / 2 words): the packed-half path of the decode kernels.
cudaError_t LaunchMmaCheck(const float* a, const float* b, const float* c, const unsigned* words,
                           float* d, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_WARP_MMA_TESTING_H_
