// Scalar reference causal grouped-query attention (in double).
#ifndef SLUICE_KERNELS_REF_ATTENTION_H_
#define SLUICE_KERNELS_REF_ATTENTION_H_

#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Parameters must be valid.
void Attention(const AttentionParams& p);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_ATTENTION_H_
