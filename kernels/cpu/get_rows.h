// Embedding lookup: rows of a GGML table dequantized to fp32.
#ifndef SLUICE_KERNELS_CPU_GET_ROWS_H_
#define SLUICE_KERNELS_CPU_GET_ROWS_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Parameters must be valid; `isa` supported by this CPU; up to `threads` OpenMP threads.
void GetRows(const GetRowsParams& p, Isa isa, int threads);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_GET_ROWS_H_
