#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace sluice::kernels::cpu {

void Rope(const RopeParams& p, Isa, int threads) {
  const int64_t half = p.rope_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(static_cast<double>(p.theta_base),
                           -2.0 * static_cast<double>(i) / static_cast<double>(p.rope_dim));
  }
  const bool parallel = threads > 1 && p.tokens * p.heads * p.head_dim >= (int64_t{1} << 15);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<float> cs(2 * half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p.positions[t]) * inv_freq[i];
        cs[2 * i] = static_cast<float>(std::cos(angle));
        cs[2 * i + 1] = static_cast<float>(std::sin(angle));
      }
      for (int64_t h = 0; h < p.heads; ++h) {
        float* x = p.x + (t * p.heads + h) * p.head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t a = p.neox ? i : 2 * i;
          const int64_t b = p.neox ? i + half : 2 * i + 1;
          const float c = cs[2 * i], s = cs[2 * i + 1];
          const float x0 = x[a], x1 = x[b];
          x[a] = x0 * c - x1 * s;
          x[b] = x0 * s + x1 * c;
        }
      }
    }
  }
}

}  // namespace sluice::kernels::cpu
