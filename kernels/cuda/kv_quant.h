// CUDA quantizer and dequantizer of KV pages: byte-identical pages to ref::KvQuantize (same
// group parameters, round-half-even, fp16 and fp8 conversions).
#ifndef SLUICE_KERNELS_CUDA_KV_QUANT_H_
#define SLUICE_KERNELS_CUDA_KV_QUANT_H_

#include <cuda_runtime_api.h>

#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// Enqueue on `stream`; parameters must be valid, data pointers in device memory.
cudaError_t LaunchKvQuantize(const KvQuantizeParams& p, cudaStream_t stream);
cudaError_t LaunchKvDequantize(const KvDequantizeParams& p, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_KV_QUANT_H_
