// Scalar reference matmul: dequantizes each weight row and accumulates in double.
#ifndef SLUICE_KERNELS_REF_MATMUL_H_
#define SLUICE_KERNELS_REF_MATMUL_H_

#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Parameters must be valid.
void Matmul(const MatmulParams& p);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_MATMUL_H_
