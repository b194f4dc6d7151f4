#include "kernels/cpu/swiglu.h"

#include <cmath>

namespace sluice::kernels::cpu {

void SwiGlu(const SwiGluParams& p, Isa, int threads) {
  const bool parallel = threads > 1 && p.n >= (int64_t{1} << 15);
#pragma omp parallel for simd num_threads(threads) if (parallel) schedule(static)
  for (int64_t i = 0; i < p.n; ++i) {
    const float g = p.gate[i];
    p.out[i] = g / (1.f + std::exp(-g)) * p.up[i];
  }
}

}  // namespace sluice::kernels::cpu
