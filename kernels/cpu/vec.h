// Vector building blocks of the CPU kernels, one body per instruction-set level: dot products,
// a 4x4 block of dot products, and fp32 dequantization of GGML rows.
#ifndef SLUICE_KERNELS_CPU_VEC_H_
#define SLUICE_KERNELS_CPU_VEC_H_

#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/ggml_quant.h"

namespace sluice::kernels::cpu {

// The most activation rows one dot_quantized call takes.
inline constexpr int kQuantizedDotRows = 8;

struct VecOps {
  // sum_i a[i] * b[i], fp32 accumulation in several lanes.
  float (*dot)(const float* a, const float* b, int64_t n);
  // out[i * 4 + j] = dot(x[i], w[j]) for four x rows (stride x_stride) and four w rows
  // (stride w_stride).
  void (*dot4x4)(const float* x, int64_t x_stride, const float* w, int64_t w_stride, int64_t n,
                 float* out);
  // Dequantizes n elements of `type` (a multiple of its block size) into dst.
  void (*dequantize)(GgmlType type, const void* src, float* dst, int64_t n);
  // out[r] = sum_i dequantize(w)[i] * x[r * n + i] for r < rows (1 to kQuantizedDotRows),
  // straight from the quantized row (q4_0, q4_1, q8_0); each block is decoded once for all
  // rows, and out[r] is the same bits whatever `rows` and r's place. xsum [rows, n / 32] holds
  // the sums of x over each 32-element block.
  void (*dot_quantized)(GgmlType type, const void* w, const float* x, const float* xsum, int64_t n,
                        int rows, float* out);
  // y[i] = exp(x[i] - shift) (x may equal y). Within 2 ulp of expf for results >= 2^-126;
  // inputs below -87.3 after the shift give about 1e-38 instead of smaller values.
  void (*exp)(const float* x, float shift, float* y, int64_t n);
  // out[i] = silu(gate[i]) * up[i] (out may equal gate or up).
  void (*swiglu)(const float* gate, const float* up, float* out, int64_t n);
};

// Whether dot_quantized handles `type`.
bool HasQuantizedDot(GgmlType type);

const VecOps& GetVecOps(Isa isa);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_VEC_H_
