// Expands rows stored in a GGML element type into fp32 on the device, bit-exact with the host's
// DequantizeRow. The CUDA matmul runs cuBLAS on these rows.
#ifndef SLUICE_KERNELS_CUDA_DEQUANTIZE_H_
#define SLUICE_KERNELS_CUDA_DEQUANTIZE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ggml_quant.h"

namespace sluice::kernels::cuda {

// dst[r, :] = dequantize(src row r) for r < rows; `cols` is a multiple of the type's block size
// and src rows follow one another (row stride = cols' row bytes). Device pointers; enqueued on
// `stream`. cudaErrorInvalidValue for a type without a device decoder.
cudaError_t LaunchDequantizeRows(GgmlType type,
                                 const void* src,  // [rows, cols] in type's storage layout
                                 int64_t rows, int64_t cols,
                                 float* dst,  // [rows, cols]
                                 cudaStream_t stream);

// The same into bf16 (round to nearest even): the operands of the bf16 tensor-core GEMM.
cudaError_t LaunchDequantizeRowsBf16(GgmlType type,
                                     const void* src,  // [rows, cols] in type's storage layout
                                     int64_t rows, int64_t cols,
                                     uint16_t* dst,  // [rows, cols] bf16 bits
                                     cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_DEQUANTIZE_H_
