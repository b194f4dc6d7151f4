#include "kernels/cpu/rmsnorm.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>

// GCC 12's AVX-512 headers self-initialize `_mm256_undefined_pd()` and warn about it when
// inlined (a header false positive, not this file's code).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace sluice::kernels::cpu {
namespace {

// Below this many elements a single thread is faster than waking a team.
constexpr int64_t kParallelMinElements = 1 << 15;

void RowScalar(const float* x, const float* w, float* y, int64_t dim, float eps) {
  // Four partial sums keep the dependency chain short and the rounding close to the SIMD paths.
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 4 <= dim; i += 4) {
    for (int l = 0; l < 4; ++l) acc[l] += x[i + l] * x[i + l];
  }
  for (; i < dim; ++i) acc[0] += x[i] * x[i];
  const float ss = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  const float scale = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
  for (i = 0; i < dim; ++i) y[i] = x[i] * scale * w[i];
}

__attribute__((target("avx2,fma"))) void RowAvx2(const float* x, const float* w, float* y,
                                                 int64_t dim, float eps) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i);
    const __m256 b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  for (; i + 8 <= dim; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
  }
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float ss = _mm_cvtss_f32(s);
  for (; i < dim; ++i) ss += x[i] * x[i];
  const float scale = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
  const __m256 vscale = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= dim; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vscale);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(w + i)));
  }
  for (; i < dim; ++i) y[i] = x[i] * scale * w[i];
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void RowAvx512(const float* x,
                                                                             const float* w,
                                                                             float* y, int64_t dim,
                                                                             float eps) {
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i);
    const __m512 b = _mm512_loadu_ps(x + i + 16);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
    acc1 = _mm512_fmadd_ps(b, b, acc1);
  }
  for (; i < dim; i += 16) {
    const __mmask16 m = i + 16 <= dim ? __mmask16(0xffff) : __mmask16((1u << (dim - i)) - 1);
    const __m512 a = _mm512_maskz_loadu_ps(m, x + i);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
  }
  acc0 = _mm512_add_ps(acc0, acc1);
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc0), _mm512_extractf32x8_ps(acc0, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  const float ss = _mm_cvtss_f32(s);
  const float scale = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (i = 0; i < dim; i += 16) {
    const __mmask16 m = i + 16 <= dim ? __mmask16(0xffff) : __mmask16((1u << (dim - i)) - 1);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vscale);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
  }
}

}  // namespace

void RmsNorm(const RmsNormParams& p, Isa isa, int threads) {
  using RowFn = void (*)(const float*, const float*, float*, int64_t, float);
  const RowFn row = isa == Isa::kAvx512 ? RowAvx512 : isa == Isa::kAvx2 ? RowAvx2 : RowScalar;
  const bool parallel = threads > 1 && p.rows > 1 && p.rows * p.dim >= kParallelMinElements;
#pragma omp parallel for schedule(static) num_threads(threads) if (parallel)
  for (int64_t r = 0; r < p.rows; ++r) {
    row(p.x + r * p.dim, p.weight, p.y + r * p.dim, p.dim, p.eps);
  }
}

}  // namespace sluice::kernels::cpu
