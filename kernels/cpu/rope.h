// Rotary position embedding; angles per (token, pair) computed once and shared by all heads,
// rotation vectorized per instruction-set level.
#ifndef SLUICE_KERNELS_CPU_ROPE_H_
#define SLUICE_KERNELS_CPU_ROPE_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Parameters must be valid; `isa` supported by this CPU; up to `threads` OpenMP threads.
void Rope(const RopeParams& p, Isa isa, int threads);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_ROPE_H_
