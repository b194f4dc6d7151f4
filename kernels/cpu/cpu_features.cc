#include "kernels/cpu/cpu_features.h"

namespace sluice::kernels::cpu {

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa BestIsa() {
  static const Isa best = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl");
    return avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kScalar;
  }();
  return best;
}

bool IsaSupported(Isa isa) { return static_cast<int>(isa) <= static_cast<int>(BestIsa()); }

}  // namespace sluice::kernels::cpu
