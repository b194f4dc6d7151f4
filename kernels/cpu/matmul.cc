#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/blas_threads.h"
#include "kernels/cpu/vec.h"

namespace sluice::kernels::cpu {

namespace {
constexpr int64_t kTileRows = 16;
// y[at] = v, or y[at] += v with p.accumulate.
inline void Store(const MatmulParams& p, int64_t at, float v) {
  p.y[at] = p.accumulate ? p.y[at] + v : v;
}

// Up to this many activation rows, quantized weights are used in place (decode); above it,
// dequantizing a tile once and reusing it across rows wins (prefill).
constexpr int64_t kMaxRowsForQuantizedDot = 4;

void MatmulQuantizedDot(const MatmulParams& p, const VecOps& ops, int threads) {
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  const int64_t row_bytes = p.k / t->block_size * t->type_size;
  const int64_t blocks = p.k / 32;
  std::vector<float> xsum(p.m * blocks);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      float s = 0;
      for (int j = 0; j < 32; ++j) s += p.x[i * p.k + b * 32 + j];
      xsum[i * blocks + b] = s;
    }
  }
  const bool parallel = threads > 1 && p.n * p.k >= (int64_t{1} << 16);
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
  for (int64_t j = 0; j < p.n; ++j) {
    const void* w = static_cast<const uint8_t*>(p.w) + j * row_bytes;
    float out[kMaxRowsForQuantizedDot];
    ops.dot_quantized(p.w_type, w, p.x, xsum.data(), p.k, static_cast<int>(p.m), out);
    for (int64_t i = 0; i < p.m; ++i) Store(p, i * p.n + j, out[i]);
  }
}

// From this many activation rows on, weight panels are dequantized once and multiplied by
// OpenBLAS's SGEMM (prefill). The scalar ISA level keeps to this file's own loops so that it
// stays a plain-C++ baseline.
constexpr int64_t kMinRowsForBlas = 16;
constexpr int64_t kPanelRows = 128;

void MatmulBlas(const MatmulParams& p, const VecOps& ops, int threads) {
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  const int64_t row_bytes = p.k / t->block_size * t->type_size;
  UseSingleThreadedBlas();
  const int64_t panels = (p.n + kPanelRows - 1) / kPanelRows;
#pragma omp parallel num_threads(threads) if (threads > 1 && panels > 1)
  {
    std::vector<float> panel(p.w_type == GgmlType::kF32 ? 0 : std::min(kPanelRows, p.n) * p.k);
#pragma omp for schedule(dynamic, 1)
    for (int64_t pi = 0; pi < panels; ++pi) {
      const int64_t n0 = pi * kPanelRows;
      const int64_t rows = std::min(kPanelRows, p.n - n0);
      const float* w =
          reinterpret_cast<const float*>(static_cast<const uint8_t*>(p.w) + n0 * row_bytes);
      if (p.w_type != GgmlType::kF32) {
        for (int64_t r = 0; r < rows; ++r) {
          ops.dequantize(p.w_type, static_cast<const uint8_t*>(p.w) + (n0 + r) * row_bytes,
                         panel.data() + r * p.k, p.k);
        }
        w = panel.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p.m, rows, p.k, 1.f, p.x, p.k, w, p.k,
                  p.accumulate ? 1.f : 0.f, p.y + n0, p.n);
    }
  }
}

}  // namespace

void Matmul(const MatmulParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  if (p.m <= kMaxRowsForQuantizedDot && HasQuantizedDot(p.w_type)) {
    return MatmulQuantizedDot(p, ops, threads);
  }
  if (p.m >= kMinRowsForBlas && isa != Isa::kScalar) return MatmulBlas(p, ops, threads);
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  const int64_t row_bytes = p.k / t->block_size * t->type_size;
  const int64_t tiles = (p.n + kTileRows - 1) / kTileRows;
  const bool parallel = threads > 1 && tiles > 1 && p.m * p.n * p.k >= (int64_t{1} << 16);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<float> tile(kTileRows * p.k);
    float block[16];
#pragma omp for schedule(dynamic, 1)
    for (int64_t ti = 0; ti < tiles; ++ti) {
      const int64_t n0 = ti * kTileRows;
      const int64_t rows = std::min(kTileRows, p.n - n0);
      for (int64_t r = 0; r < rows; ++r) {
        ops.dequantize(p.w_type, static_cast<const uint8_t*>(p.w) + (n0 + r) * row_bytes,
                       tile.data() + r * p.k, p.k);
      }
      int64_t i = 0;
      for (; i + 4 <= p.m; i += 4) {
        int64_t r = 0;
        for (; r + 4 <= rows; r += 4) {
          ops.dot4x4(p.x + i * p.k, p.k, tile.data() + r * p.k, p.k, p.k, block);
          for (int a = 0; a < 4; ++a) {
            for (int b = 0; b < 4; ++b) Store(p, (i + a) * p.n + n0 + r + b, block[a * 4 + b]);
          }
        }
        for (; r < rows; ++r) {
          for (int a = 0; a < 4; ++a) {
            Store(p, (i + a) * p.n + n0 + r,
                  ops.dot(p.x + (i + a) * p.k, tile.data() + r * p.k, p.k));
          }
        }
      }
      for (; i < p.m; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          Store(p, i * p.n + n0 + r, ops.dot(p.x + i * p.k, tile.data() + r * p.k, p.k));
        }
      }
    }
  }
}

}  // namespace sluice::kernels::cpu
