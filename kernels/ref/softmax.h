// Scalar reference row-wise softmax (in double).
#ifndef SLUICE_KERNELS_REF_SOFTMAX_H_
#define SLUICE_KERNELS_REF_SOFTMAX_H_

#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Parameters must be valid.
void Softmax(const SoftmaxParams& p);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_SOFTMAX_H_
