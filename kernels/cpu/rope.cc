#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace sluice::kernels::cpu {
namespace {

// Rotates every head of one token by per-pair cos/sin [half]. Inlined into one function per
// instruction-set level below, so the compiler vectorizes it for each.
template <bool kNeox>
__attribute__((always_inline)) inline void RotateToken(float* x, const float* cos, const float* sin,
                                                       int64_t heads, int64_t head_dim,
                                                       int64_t half) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = kNeox ? i : 2 * i;
      const int64_t b = kNeox ? i + half : 2 * i + 1;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cos[i] - x1 * sin[i];
      v[b] = x0 * sin[i] + x1 * cos[i];
    }
  }
}

using RotateFn = void (*)(bool neox, float* x, const float* cos, const float* sin, int64_t heads,
                          int64_t head_dim, int64_t half);

void RotateScalar(bool neox, float* x, const float* c, const float* s, int64_t heads, int64_t d,
                  int64_t half) {
  neox ? RotateToken<true>(x, c, s, heads, d, half) : RotateToken<false>(x, c, s, heads, d, half);
}

__attribute__((target("avx2,fma"))) void RotateAvx2(bool neox, float* x, const float* c,
                                                    const float* s, int64_t heads, int64_t d,
                                                    int64_t half) {
  neox ? RotateToken<true>(x, c, s, heads, d, half) : RotateToken<false>(x, c, s, heads, d, half);
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))) void RotateAvx512(
    bool neox, float* x, const float* c, const float* s, int64_t heads, int64_t d, int64_t half) {
  neox ? RotateToken<true>(x, c, s, heads, d, half) : RotateToken<false>(x, c, s, heads, d, half);
}

}  // namespace

void Rope(const RopeParams& p, Isa isa, int threads) {
  const RotateFn rotate = isa == Isa::kAvx512 ? RotateAvx512
                          : isa == Isa::kAvx2 ? RotateAvx2
                                              : RotateScalar;
  const int64_t half = p.rope_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(static_cast<double>(p.theta_base),
                           -2.0 * static_cast<double>(i) / static_cast<double>(p.rope_dim));
  }
  const bool parallel = threads > 1 && p.tokens * p.heads * p.head_dim >= (int64_t{1} << 15);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<float> cos(half), sin(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.tokens; ++t) {
      // Angles in double, once per token for all heads.
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p.positions[t]) * inv_freq[i];
        cos[i] = static_cast<float>(std::cos(angle));
        sin[i] = static_cast<float>(std::sin(angle));
      }
      rotate(p.neox, p.x + t * p.heads * p.head_dim, cos.data(), sin.data(), p.heads, p.head_dim,
             half);
    }
  }
}

}  // namespace sluice::kernels::cpu
