// Threaded RMSNorm for the CPU backend; the sum of squares uses the ISA-level dot product.
#ifndef SLUICE_KERNELS_CPU_RMSNORM_H_
#define SLUICE_KERNELS_CPU_RMSNORM_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Parameters must be valid; `isa` must be supported by this CPU. Rows are split across up to
// `threads` OpenMP threads when the problem is large enough to pay for them.
void RmsNorm(const RmsNormParams& p, Isa isa, int threads);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_RMSNORM_H_
