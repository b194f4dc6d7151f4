#include "kernels/cpu/vec.h"

#include <immintrin.h>

#include <cmath>
#include <type_traits>

// GCC 12's AVX-512 headers self-initialize `_mm256_undefined_pd()` and warn about it when
// inlined (a header false positive, not this file's code).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace sluice::kernels::cpu {
namespace {

#define SLUICE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SLUICE_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

// ---- scalar ----

float DotScalar(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void Dot4x4Scalar(const float* x, int64_t xs, const float* w, int64_t ws, int64_t n, float* out) {
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) out[i * 4 + j] = DotScalar(x + i * xs, w + j * ws, n);
  }
}

void DotQuantizedScalar(GgmlType type, const void* w, const float* x, const float*, int64_t n,
                        int rows, float* out) {
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(type));
  float block[32];
  for (int r = 0; r < rows; ++r) out[r] = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    DequantizeRow(type, static_cast<const uint8_t*>(w) + b * t->type_size, block, 32);
    for (int r = 0; r < rows; ++r) out[r] += DotScalar(block, x + r * n + b * 32, 32);
  }
}

void ExpScalar(const float* x, float shift, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - shift);
}

void SwiGluScalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

// exp(x) as 2^k * p(r), x = k ln2 + r, |r| <= ln2 / 2, with Cephes' expf polynomial.
constexpr float kExpHi = 88.3762626647949f;
constexpr float kExpLo = -87.3365447504019f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                            4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

// ---- AVX2 ----

// a * b + c rounded once, spelled out: the compiler must not choose between a fused and a
// separate multiply per call site, or a row's sum would depend on how many rows share the call.
SLUICE_AVX2 inline float FmaAvx2(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

SLUICE_AVX2 inline float HsumAvx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

SLUICE_AVX2 float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  float s = HsumAvx2(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

SLUICE_AVX2 void Dot4x4Avx2(const float* x, int64_t xs, const float* w, int64_t ws, int64_t n,
                            float* out) {
  if (n % 8 != 0) return Dot4x4Scalar(x, xs, w, ws, n, out);
  __m256 acc[4][4];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < n; c += 8) {
    __m256 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = _mm256_loadu_ps(w + j * ws + c);
    for (int i = 0; i < 4; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * xs + c);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) out[i * 4 + j] = HsumAvx2(acc[i][j]);
  }
}

SLUICE_AVX2 inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

// Decodes one 32-element block of `type` into four 8-float vectors (scale applied) and adds
// its minimum term (q4_1 m, q4_0's -8 d) to `offset_scale`.
SLUICE_AVX2 inline void DecodeBlockAvx2(GgmlType type, const void* w, int64_t b, __m256 v[4],
                                        float* offset_scale) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  auto nibbles = [&](const uint8_t* qs, float d) SLUICE_AVX2 {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i lo = _mm_and_si128(q, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    const __m256 vd = _mm256_set1_ps(d);
    v[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), vd);
    v[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), vd);
    v[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), vd);
    v[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), vd);
  };
  switch (type) {
    case GgmlType::kQ4_1: {
      const auto& blk = static_cast<const BlockQ4_1*>(w)[b];
      nibbles(blk.qs, HalfToFloat(blk.d));
      *offset_scale = HalfToFloat(blk.m);
      return;
    }
    case GgmlType::kQ4_0: {
      const auto& blk = static_cast<const BlockQ4_0*>(w)[b];
      const float d = HalfToFloat(blk.d);
      nibbles(blk.qs, d);
      *offset_scale = -8.f * d;
      return;
    }
    default: {  // q8_0
      const auto& blk = static_cast<const BlockQ8_0*>(w)[b];
      const __m256 vd = _mm256_set1_ps(HalfToFloat(blk.d));
      for (int j = 0; j < 4; ++j) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.qs + 8 * j));
        v[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vd);
      }
      *offset_scale = 0.f;
      return;
    }
  }
}

SLUICE_AVX2 void DequantizeAvx2(GgmlType type, const void* src, float* dst, int64_t n) {
  if (!HasQuantizedDot(type)) return DequantizeRow(type, src, dst, n);
  for (int64_t b = 0; b < n / 32; ++b, dst += 32) {
    __m256 v[4];
    float m;
    DecodeBlockAvx2(type, src, b, v, &m);
    const __m256 vm = _mm256_set1_ps(m);
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(dst + 8 * j, _mm256_add_ps(v[j], vm));
  }
}

SLUICE_AVX2 void DotQuantizedAvx2(GgmlType type, const void* w, const float* x, const float* xsum,
                                  int64_t n, int rows, float* out) {
  if (!HasQuantizedDot(type)) return DotQuantizedScalar(type, w, x, xsum, n, rows, out);
  const int64_t blocks = n / 32;
  __m256 acc[kQuantizedDotRows];
  float offset[kQuantizedDotRows];
  for (int r = 0; r < rows; ++r) {
    acc[r] = _mm256_setzero_ps();
    offset[r] = 0.f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 v[4];
    float m;
    DecodeBlockAvx2(type, w, b, v, &m);
    for (int r = 0; r < rows; ++r) {
      const float* xb = x + r * n + b * 32;
      __m256 a = acc[r];
      for (int j = 0; j < 4; ++j) a = _mm256_fmadd_ps(v[j], _mm256_loadu_ps(xb + 8 * j), a);
      acc[r] = a;
      offset[r] = FmaAvx2(m, xsum[r * blocks + b], offset[r]);
    }
  }
  for (int r = 0; r < rows; ++r) out[r] = HsumAvx2(acc[r]) + offset[r];
}

SLUICE_AVX2 inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpP[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP[i]));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.f));
  // 2^k through the exponent field (k in [-126, 127] after the clamp).
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

SLUICE_AVX2 void ExpAvx2(const float* x, float shift, float* y, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
  for (; i < n; ++i) y[i] = std::exp(x[i] - shift);
}

SLUICE_AVX2 void SwiGluAvx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(
        out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  SwiGluScalar(gate + i, up + i, out + i, n - i);
}

// ---- AVX-512 ----

SLUICE_AVX512 float DotAvx512(const float* a, const float* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = i + 16 <= n ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  acc0 = _mm512_add_ps(acc0, acc1);
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc0), _mm512_extractf32x8_ps(acc0, 1));
  return HsumAvx2(h);
}

SLUICE_AVX512 void Dot4x4Avx512(const float* x, int64_t xs, const float* w, int64_t ws, int64_t n,
                                float* out) {
  if (n % 16 != 0) return Dot4x4Avx2(x, xs, w, ws, n, out);
  __m512 acc[4][4];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < n; c += 16) {
    __m512 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = _mm512_loadu_ps(w + j * ws + c);
    for (int i = 0; i < 4; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * xs + c);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      const __m256 h =
          _mm256_add_ps(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
      out[i * 4 + j] = HsumAvx2(h);
    }
  }
}

// Decodes block b of a q4_0 / q4_1 / q8_0 row into two 16-float vectors (scale applied) and
// returns its minimum term (q4_1's m, q4_0's -8 d, 0 for q8_0).
template <GgmlType kType>
SLUICE_AVX512 inline float DecodeBlockAvx512(const void* w, int64_t b, __m512& v0, __m512& v1) {
  if constexpr (kType == GgmlType::kQ8_0) {
    const auto& blk = static_cast<const BlockQ8_0*>(w)[b];
    const __m512 vd = _mm512_set1_ps(HalfToFloat(blk.d));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs + 16));
    v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), vd);
    v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), vd);
    return 0.f;
  } else {
    using Block = std::conditional_t<kType == GgmlType::kQ4_1, BlockQ4_1, BlockQ4_0>;
    const auto& blk = static_cast<const Block*>(w)[b];
    const float d = HalfToFloat(blk.d);
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
    const __m128i lo = _mm_and_si128(q, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    const __m512 vd = _mm512_set1_ps(d);
    v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), vd);
    v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), vd);
    if constexpr (kType == GgmlType::kQ4_1) {
      return HalfToFloat(blk.m);
    } else {
      return -8.f * d;
    }
  }
}

template <GgmlType kType>
SLUICE_AVX512 void DequantizeTypeAvx512(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, dst += 32) {
    __m512 v0, v1;
    const __m512 m = _mm512_set1_ps(DecodeBlockAvx512<kType>(src, b, v0, v1));
    _mm512_storeu_ps(dst, _mm512_add_ps(v0, m));
    _mm512_storeu_ps(dst + 16, _mm512_add_ps(v1, m));
  }
}

SLUICE_AVX512 void DequantizeAvx512(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::kQ4_1:
      return DequantizeTypeAvx512<GgmlType::kQ4_1>(src, dst, n);
    case GgmlType::kQ4_0:
      return DequantizeTypeAvx512<GgmlType::kQ4_0>(src, dst, n);
    case GgmlType::kQ8_0:
      return DequantizeTypeAvx512<GgmlType::kQ8_0>(src, dst, n);
    default:
      return DequantizeRow(type, src, dst, n);
  }
}

// kRows activation rows against one quantized weight row, accumulators in registers.
template <GgmlType kType, int kRows>
SLUICE_AVX512 void DotQuantizedRowsAvx512(const void* w, const float* x, const float* xsum,
                                          int64_t n, float* out) {
  const int64_t blocks = n / 32;
  __m512 acc[kRows];
  float offset[kRows];
  for (int r = 0; r < kRows; ++r) {
    acc[r] = _mm512_setzero_ps();
    offset[r] = 0.f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 v0, v1;
    const float m = DecodeBlockAvx512<kType>(w, b, v0, v1);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const float* xb = x + r * n + b * 32;
      acc[r] = _mm512_fmadd_ps(v1, _mm512_loadu_ps(xb + 16),
                               _mm512_fmadd_ps(v0, _mm512_loadu_ps(xb), acc[r]));
      if constexpr (kType != GgmlType::kQ8_0)
        offset[r] = FmaAvx2(m, xsum[r * blocks + b], offset[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const __m256 h =
        _mm256_add_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1));
    out[r] = HsumAvx2(h) + offset[r];
  }
}

template <GgmlType kType>
SLUICE_AVX512 void DotQuantizedTypeAvx512(const void* w, const float* x, const float* xsum,
                                          int64_t n, int rows, float* out) {
  switch (rows) {
    case 1:
      return DotQuantizedRowsAvx512<kType, 1>(w, x, xsum, n, out);
    case 2:
      return DotQuantizedRowsAvx512<kType, 2>(w, x, xsum, n, out);
    case 3:
      return DotQuantizedRowsAvx512<kType, 3>(w, x, xsum, n, out);
    case 4:
      return DotQuantizedRowsAvx512<kType, 4>(w, x, xsum, n, out);
    case 5:
      return DotQuantizedRowsAvx512<kType, 5>(w, x, xsum, n, out);
    case 6:
      return DotQuantizedRowsAvx512<kType, 6>(w, x, xsum, n, out);
    case 7:
      return DotQuantizedRowsAvx512<kType, 7>(w, x, xsum, n, out);
    default:
      return DotQuantizedRowsAvx512<kType, 8>(w, x, xsum, n, out);
  }
}

SLUICE_AVX512 void DotQuantizedAvx512(GgmlType type, const void* w, const float* x,
                                      const float* xsum, int64_t n, int rows, float* out) {
  switch (type) {
    case GgmlType::kQ4_1:
      return DotQuantizedTypeAvx512<GgmlType::kQ4_1>(w, x, xsum, n, rows, out);
    case GgmlType::kQ4_0:
      return DotQuantizedTypeAvx512<GgmlType::kQ4_0>(w, x, xsum, n, rows, out);
    case GgmlType::kQ8_0:
      return DotQuantizedTypeAvx512<GgmlType::kQ8_0>(w, x, xsum, n, rows, out);
    default:
      return DotQuantizedScalar(type, w, x, xsum, n, rows, out);
  }
}

SLUICE_AVX512 inline __m512 Exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpP[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[i]));
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, k);
}

SLUICE_AVX512 void ExpAvx512(const float* x, float shift, float* y, int64_t n) {
  const __m512 s = _mm512_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = i + 16 <= n ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
  }
}

SLUICE_AVX512 void SwiGluAvx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = i + 16 <= n ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_mask_storeu_ps(
        out + i, m,
        _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

constexpr VecOps kScalar = {DotScalar,          Dot4x4Scalar, DequantizeRow,
                            DotQuantizedScalar, ExpScalar,    SwiGluScalar};
constexpr VecOps kAvx2 = {DotAvx2,          Dot4x4Avx2, DequantizeAvx2,
                          DotQuantizedAvx2, ExpAvx2,    SwiGluAvx2};
constexpr VecOps kAvx512 = {DotAvx512,          Dot4x4Avx512, DequantizeAvx512,
                            DotQuantizedAvx512, ExpAvx512,    SwiGluAvx512};

}  // namespace

bool HasQuantizedDot(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ8_0;
}

const VecOps& GetVecOps(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return kAvx512;
    case Isa::kAvx2:
      return kAvx2;
    case Isa::kScalar:
      break;
  }
  return kScalar;
}

}  // namespace sluice::kernels::cpu
