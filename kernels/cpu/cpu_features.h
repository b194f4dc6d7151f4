// What vector instructions this CPU has, read once at run time.
#ifndef SLUICE_KERNELS_CPU_CPU_FEATURES_H_
#define SLUICE_KERNELS_CPU_CPU_FEATURES_H_

#include <string_view>

namespace sluice::kernels::cpu {

// Instruction-set levels the CPU kernels are written for, lowest first.
enum class Isa { kScalar, kAvx2, kAvx512 };
std::string_view IsaName(Isa isa);

// The highest level this machine supports (AVX2 also requires FMA and F16C; AVX-512 requires
// F, BW, DQ and VL).
Isa BestIsa();
bool IsaSupported(Isa isa);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_CPU_FEATURES_H_
