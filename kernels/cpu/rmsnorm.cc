#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <cstdint>

#include "kernels/cpu/vec.h"

namespace sluice::kernels::cpu {
namespace {

// Below this many elements a single thread is faster than waking a team.
constexpr int64_t kParallelMinElements = 1 << 15;

}  // namespace

void RmsNorm(const RmsNormParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  const bool parallel = threads > 1 && p.rows > 1 && p.rows * p.dim >= kParallelMinElements;
#pragma omp parallel for schedule(static) num_threads(threads) if (parallel)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.dim;
    float* y = p.y + r * p.dim;
    const float ss = ops.dot(x, x, p.dim);  // sum of squares, vectorized for `isa`
    const float scale = 1.f / std::sqrt(ss / static_cast<float>(p.dim) + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) y[i] = x[i] * scale * p.weight[i];
  }
}

}  // namespace sluice::kernels::cpu
