// Scalar reference rotary position embedding (angles in double).
#ifndef SLUICE_KERNELS_REF_ROPE_H_
#define SLUICE_KERNELS_REF_ROPE_H_

#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Parameters must be valid.
void Rope(const RopeParams& p);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_ROPE_H_
