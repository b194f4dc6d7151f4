// Scalar reference RMSNorm: the oracle the other backends are tested against.
#ifndef SLUICE_KERNELS_REF_RMSNORM_H_
#define SLUICE_KERNELS_REF_RMSNORM_H_

#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Accumulates in double and rounds once per output. Parameters must be valid.
void RmsNorm(const RmsNormParams& p);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_RMSNORM_H_
