#include "kernels/ref/matmul.h"

#include <vector>

namespace sluice::kernels::ref {

void Matmul(const MatmulParams& p) {
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  const int64_t row_bytes = p.k / t->block_size * t->type_size;
  std::vector<float> w(p.k);
  for (int64_t j = 0; j < p.n; ++j) {
    DequantizeRow(p.w_type, static_cast<const uint8_t*>(p.w) + j * row_bytes, w.data(), p.k);
    for (int64_t i = 0; i < p.m; ++i) {
      const float* x = p.x + i * p.k;
      double acc = p.accumulate ? p.y[i * p.n + j] : 0.0;
      for (int64_t c = 0; c < p.k; ++c) acc += static_cast<double>(x[c]) * w[c];
      p.y[i * p.n + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace sluice::kernels::ref
