// SwiGLU activation, element-wise.
#ifndef SLUICE_KERNELS_CPU_SWIGLU_H_
#define SLUICE_KERNELS_CPU_SWIGLU_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Parameters must be valid; `isa` supported by this CPU; up to `threads` OpenMP threads.
void SwiGlu(const SwiGluParams& p, Isa isa, int threads);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_SWIGLU_H_
