// Causal grouped-query attention over a contiguous KV cache: two SGEMMs per head (the scalar
// ISA level keeps plain per-(token, head) loops), or, when key scores are asked for, a two-pass
// tiled kernel whose memory does not grow with the number of queries.
#ifndef SLUICE_KERNELS_CPU_ATTENTION_H_
#define SLUICE_KERNELS_CPU_ATTENTION_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Parameters must be valid; `isa` supported by this CPU; up to `threads` OpenMP threads.
void Attention(const AttentionParams& p, Isa isa, int threads);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_ATTENTION_H_
