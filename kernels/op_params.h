// Parameter structs for sluice's math ops. Plain data and pointers only, so the same struct
// reaches the scalar reference, the CPU kernels and the CUDA kernels unchanged. Every pointer
// carries its shape; pointers live on the device of the backend that runs the op.
#ifndef SLUICE_KERNELS_OP_PARAMS_H_
#define SLUICE_KERNELS_OP_PARAMS_H_

#include <cstdint>

namespace sluice::kernels {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:]
struct RmsNormParams {
  const float* x = nullptr;       // [rows, dim], contiguous
  const float* weight = nullptr;  // [dim]
  float* y = nullptr;             // [rows, dim], contiguous; may equal x (in place)
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-5f;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_OP_PARAMS_H_
