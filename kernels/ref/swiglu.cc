#include "kernels/ref/swiglu.h"

#include <cmath>

namespace sluice::kernels::ref {

void SwiGlu(const SwiGluParams& p) {
  for (int64_t i = 0; i < p.n; ++i) {
    const double g = p.gate[i];
    p.out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * p.up[i]);
  }
}

}  // namespace sluice::kernels::ref
