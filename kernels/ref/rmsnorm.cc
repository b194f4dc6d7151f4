#include "kernels/ref/rmsnorm.h"

#include <cmath>

namespace sluice::kernels::ref {

void RmsNorm(const RmsNormParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.dim;
    float* y = p.y + r * p.dim;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
    const double scale = 1.0 / std::sqrt(sum_sq / static_cast<double>(p.dim) + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      y[i] = static_cast<float>(static_cast<double>(x[i]) * scale * p.weight[i]);
    }
  }
}

}  // namespace sluice::kernels::ref
