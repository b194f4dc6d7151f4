// Matmul with on-the-fly dequantization: weight rows are dequantized 16 at a time
// into a per-thread fp32 tile, then multiplied in 4x4 register blocks.
#ifndef SLUICE_KERNELS_CPU_MATMUL_H_
#define SLUICE_KERNELS_CPU_MATMUL_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Parameters must be valid; `isa` supported by this CPU; up to `threads` OpenMP threads.
void Matmul(const MatmulParams& p, Isa isa, int threads);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_MATMUL_H_
