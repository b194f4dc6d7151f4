#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/vec.h"

namespace sluice::kernels::cpu {

void Softmax(const SoftmaxParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  const bool parallel = threads > 1 && p.rows > 1 && p.rows * p.cols >= (int64_t{1} << 15);
#pragma omp parallel for num_threads(threads) if (parallel)
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.cols;
    const float mx = *std::max_element(x, x + p.cols);
    ops.exp(x, mx, x, p.cols);
    float sum = 0;
    for (int64_t c = 0; c < p.cols; ++c) sum += x[c];
    const float inv = 1.f / sum;
    for (int64_t c = 0; c < p.cols; ++c) x[c] *= inv;
  }
}

}  // namespace sluice::kernels::cpu
