#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/blas_threads.h"
#include "kernels/cpu/vec.h"

namespace sluice::kernels::cpu {

// Every path below computes an output row from its own activation row alone, in an order that
// does not depend on m or on the row's place (MatmulRows): rows are handled in fixed groups,
// the last group padded with zero rows, and every output element is one thread's.

namespace {

// y[at] = v, or y[at] += v with p.accumulate.
inline void Store(const MatmulParams& p, int64_t at, float v) {
  p.y[at] = p.accumulate ? p.y[at] + v : v;
}

// Activation rows [i0, i0 + n) of x, or a copy of them padded with zero rows to `group` rows
// (in `pad`) when fewer than `group` are left.
const float* RowGroup(const MatmulParams& p, int64_t i0, int64_t group, std::vector<float>& pad) {
  const int64_t n = std::min(group, p.m - i0);
  if (n == group) return p.x + i0 * p.k;
  pad.assign(group * p.k, 0.f);
  std::memcpy(pad.data(), p.x + i0 * p.k, static_cast<size_t>(n * p.k) * sizeof(float));
  return pad.data();
}

// Quantized weights (q4_0, q4_1, q8_0) for a few rows: weight rows are read in place, in chunks
// of kDotChunk rows, each chunk against the activation rows kQuantizedDotRows at a time (a
// group of rows stays in L1 while the chunk's rows pass; dot_quantized's rows are independent).
constexpr int64_t kDotChunk = 32;

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
  const int64_t chunks = (p.n + kDotChunk - 1) / kDotChunk;
  const bool parallel = threads > 1 && chunks > 1 && p.n * p.k >= (int64_t{1} << 16);
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j1 = std::min(p.n, (c + 1) * kDotChunk);
    float out[kQuantizedDotRows];
    for (int64_t i0 = 0; i0 < p.m; i0 += kQuantizedDotRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kQuantizedDotRows, p.m - i0));
      for (int64_t j = c * kDotChunk; j < j1; ++j) {
        ops.dot_quantized(p.w_type, static_cast<const uint8_t*>(p.w) + j * row_bytes,
                          p.x + i0 * p.k, xsum.data() + i0 * blocks, p.k, rows, out);
        for (int i = 0; i < rows; ++i) Store(p, (i0 + i) * p.n + j, out[i]);
      }
    }
  }
}

// Weight panels of kPanelRows rows dequantized once and multiplied by OpenBLAS's SGEMM (a
// prompt's rows). The library picks its kernels, and so a row's order of sums, by the call's
// shape, and its kernels take kBlasRowUnit rows of x at a time: every call here has a full
// panel (the last one padded with zero rows) and a multiple of kBlasRowUnit rows of x (all its
// whole groups in one call, then the last rows padded with zero rows to a group of their own),
// the shapes under which a row's result does not depend on the other rows or its place among
// them (MatmulTest.RowsDoNotDependOnTheirBatch checks it on the machine it runs on).
constexpr int64_t kBlasRowUnit = 16;
constexpr int64_t kPanelRows = 128;

void MatmulBlas(const MatmulParams& p, const VecOps& ops, int threads) {
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  const int64_t row_bytes = p.k / t->block_size * t->type_size;
  UseSingleThreadedBlas();
  const int64_t panels = (p.n + kPanelRows - 1) / kPanelRows;
  const float beta = p.accumulate ? 1.f : 0.f;
  const int64_t whole = p.m / kBlasRowUnit * kBlasRowUnit, tail = p.m - whole;
  std::vector<float> x_tail;  // the last rows, padded
  const float* x_last = tail > 0 ? RowGroup(p, whole, kBlasRowUnit, x_tail) : nullptr;
#pragma omp parallel num_threads(threads) if (threads > 1 && panels > 1)
  {
    std::vector<float> panel(kPanelRows * p.k);
    std::vector<float> y_pad;
    // y[the rows, the panel's columns] = (or +=) x's `count` rows (a multiple of kBlasRowUnit, the
    // first `real` of them real) times the panel w^T, through y_pad where the panel is short or
    // rows are padded: y's rows go in too, as SGEMM adds to them as it goes when beta is 1.
    const auto multiply = [&](const float* w, const float* x, int64_t count, int64_t real, float* y,
                              int64_t columns) {
      const bool direct = real == count && columns == kPanelRows;
      if (!direct) {
        y_pad.assign(count * kPanelRows, 0.f);
        for (int64_t i = 0; i < real && p.accumulate; ++i) {
          std::memcpy(y_pad.data() + i * kPanelRows, y + i * p.n,
                      static_cast<size_t>(columns) * sizeof(float));
        }
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, count, kPanelRows, p.k, 1.f, x, p.k, w,
                  p.k, beta, direct ? y : y_pad.data(), direct ? p.n : kPanelRows);
      for (int64_t i = 0; i < real && !direct; ++i) {
        std::memcpy(y + i * p.n, y_pad.data() + i * kPanelRows,
                    static_cast<size_t>(columns) * sizeof(float));
      }
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t pi = 0; pi < panels; ++pi) {
      const int64_t n0 = pi * kPanelRows;
      const int64_t rows = std::min(kPanelRows, p.n - n0);
      const float* w = panel.data();
      if (p.w_type == GgmlType::kF32 && rows == kPanelRows) {
        w = static_cast<const float*>(p.w) + n0 * p.k;  // a full f32 panel is read in place
      } else {
        for (int64_t r = 0; r < rows; ++r) {
          ops.dequantize(p.w_type, static_cast<const uint8_t*>(p.w) + (n0 + r) * row_bytes,
                         panel.data() + r * p.k, p.k);
        }
        std::fill(panel.begin() + rows * p.k, panel.end(), 0.f);
      }
      if (whole > 0) multiply(w, p.x, whole, whole, p.y + n0, rows);
      if (tail > 0) multiply(w, x_last, kBlasRowUnit, tail, p.y + whole * p.n + n0, rows);
    }
  }
}

// Weight rows dequantized kTileRows at a time into a per-thread fp32 tile (its unused rows
// zero), then multiplied in 4x4 blocks, activation rows padded to a multiple of four.
constexpr int64_t kTileRows = 16;

void MatmulTiles(const MatmulParams& p, const VecOps& ops, int threads) {
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  const int64_t row_bytes = p.k / t->block_size * t->type_size;
  const int64_t tiles = (p.n + kTileRows - 1) / kTileRows;
  const bool parallel = threads > 1 && tiles > 1 && p.m * p.n * p.k >= (int64_t{1} << 16);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<float> tile(kTileRows * p.k);
    std::vector<float> x_pad;
    float block[16];
#pragma omp for schedule(dynamic, 1)
    for (int64_t ti = 0; ti < tiles; ++ti) {
      const int64_t n0 = ti * kTileRows;
      const int64_t rows = std::min(kTileRows, p.n - n0);
      for (int64_t r = 0; r < rows; ++r) {
        ops.dequantize(p.w_type, static_cast<const uint8_t*>(p.w) + (n0 + r) * row_bytes,
                       tile.data() + r * p.k, p.k);
      }
      std::fill(tile.begin() + rows * p.k, tile.end(), 0.f);
      for (int64_t i0 = 0; i0 < p.m; i0 += 4) {
        const float* x = RowGroup(p, i0, 4, x_pad);
        const int64_t x_rows = std::min<int64_t>(4, p.m - i0);
        for (int64_t r = 0; r < rows; r += 4) {
          ops.dot4x4(x, p.k, tile.data() + r * p.k, p.k, p.k, block);
          for (int64_t a = 0; a < x_rows; ++a) {
            for (int64_t b = 0; b < 4 && r + b < rows; ++b) {
              Store(p, (i0 + a) * p.n + n0 + r + b, block[a * 4 + b]);
            }
          }
        }
      }
    }
  }
}

}  // namespace

void Matmul(const MatmulParams& p, Isa isa, int threads) {
  const VecOps& ops = GetVecOps(isa);
  if (p.rows == MatmulRows::kFew && HasQuantizedDot(p.w_type)) {
    return MatmulQuantizedDot(p, ops, threads);
  }
  if (p.rows == MatmulRows::kMany && isa != Isa::kScalar) return MatmulBlas(p, ops, threads);
  return MatmulTiles(p, ops, threads);
}

}  // namespace sluice::kernels::cpu
