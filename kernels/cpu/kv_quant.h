// The CPU quantizer of KV pages: byte-identical to ref::KvQuantize (the same group parameters
// and rounding), with the per-group loops vectorized per instruction-set level.
#ifndef SLUICE_KERNELS_CPU_KV_QUANT_H_
#define SLUICE_KERNELS_CPU_KV_QUANT_H_

#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Parameters must be valid (Backend::KvQuantize checks them).
void KvQuantize(const KvQuantizeParams& p, Isa isa);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_KV_QUANT_H_
