#include "kernels/ref/rope.h"

#include <cmath>

namespace sluice::kernels::ref {

void Rope(const RopeParams& p) {
  const int64_t half = p.rope_dim / 2;
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t h = 0; h < p.heads; ++h) {
      float* x = p.x + (t * p.heads + h) * p.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double freq =
            std::pow(static_cast<double>(p.theta_base),
                     -2.0 * static_cast<double>(i) / static_cast<double>(p.rope_dim));
        const double angle = static_cast<double>(p.positions[t]) * freq;
        const double c = std::cos(angle), s = std::sin(angle);
        const int64_t a = p.neox ? i : 2 * i;
        const int64_t b = p.neox ? i + half : 2 * i + 1;
        const double x0 = x[a], x1 = x[b];
        x[a] = static_cast<float>(x0 * c - x1 * s);
        x[b] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace sluice::kernels::ref
