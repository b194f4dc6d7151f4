// Reference attention over compressed KV pages: dequantizes every live slot with the reference
// dequantizer and runs plain softmax attention in double precision.
#ifndef SLUICE_KERNELS_REF_PAGED_ATTENTION_H_
#define SLUICE_KERNELS_REF_PAGED_ATTENTION_H_

#include "absl/status/status.h"
#include "kernels/op_params.h"

namespace sluice::kernels::ref {

// Parameters must be valid (Backend::PagedAttention checks them).
absl::Status PagedAttention(const PagedAttentionParams& p);

}  // namespace sluice::kernels::ref

#endif  // SLUICE_KERNELS_REF_PAGED_ATTENTION_H_
