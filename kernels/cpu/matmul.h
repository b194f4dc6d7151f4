// Matmul with on-the-fly dequantization, the algorithm chosen by MatmulRows, never by m (so a
// row's result does not depend on its batch): kFew reads quantized weights in place with the
// quantized dot products; kMany expands weight panels once for OpenBLAS SGEMM in fixed row
// groups; other weight types (and the scalar ISA) go through fp32 tiles in 4x4 register blocks.
#ifndef SLUICE_KERNELS_CPU_MATMUL_H_
#define SLUICE_KERNELS_CPU_MATMUL_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Parameters must be valid; `isa` supported by this CPU; up to `threads` OpenMP threads.
void Matmul(const MatmulParams& p, Isa isa, int threads);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_MATMUL_H_
