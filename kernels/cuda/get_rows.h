// CUDA embedding lookup: gathers table rows by id and dequantizes them on the device, bit-exact
// with ref::GetRows for every GGML type of kernels/ggml_quant.h.
#ifndef SLUICE_KERNELS_CUDA_GET_ROWS_H_
#define SLUICE_KERNELS_CUDA_GET_ROWS_H_

#include <cuda_runtime_api.h>

#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// Enqueues the lookup on `stream`; parameters must be valid, data pointers in device memory,
// count <= 2^31 - 1. An id outside [0, rows) yields a row of NaNs rather than a read out of
// bounds. cudaErrorInvalidValue for a table type without a device decoder.
cudaError_t LaunchGetRows(const GetRowsParams& p, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_GET_ROWS_H_
