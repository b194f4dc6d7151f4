// Scalar reference SwiGLU activation (in double).
#ifndef SLUICE_KERNELS_REF_SWIGLU_H_
#define SLUICE_KERNELS_REF_SWIGLU_H_

#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Parameters must be valid.
void SwiGlu(const SwiGluParams& p);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_SWIGLU_H_
