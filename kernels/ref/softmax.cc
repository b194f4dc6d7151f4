#include "kernels/ref/softmax.h"

#include <algorithm>
#include <cmath>

namespace sluice::kernels::ref {

void Softmax(const SoftmaxParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.cols;
    const double mx = *std::max_element(x, x + p.cols);
    double sum = 0;
    for (int64_t c = 0; c < p.cols; ++c) sum += std::exp(x[c] - mx);
    for (int64_t c = 0; c < p.cols; ++c) x[c] = static_cast<float>(std::exp(x[c] - mx) / sum);
  }
}

}  // namespace sluice::kernels::ref
