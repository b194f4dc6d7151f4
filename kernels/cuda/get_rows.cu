#include <cstdint>

#include "kernels/cuda/get_rows.h"
#include "kernels/cuda/ggml_dequant.cuh"
#include "kernels/cuda/launch.cuh"

namespace sluice::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// grid: [count], block: [kThreads]; each block expands one looked-up row.
template <GgmlType kType>
__global__ void __launch_bounds__(kThreads)
    GetRowsKernel(const uint8_t* __restrict__ table,  // [rows, row_bytes]
                  const int32_t* __restrict__ ids,    // [count]
                  float* __restrict__ out,            // [count, dim]
                  int64_t rows, int64_t dim) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * dim;
  if (id < 0 || id >= rows) {
    for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) o[e] = __int_as_float(0x7fc00000);
    return;
  }
  const uint8_t* row = table + id * GgmlRowBytes<kType>(dim);
  for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) o[e] = DequantElement<kType>(row, e);
}

}  // namespace

cudaError_t LaunchGetRows(const GetRowsParams& p, cudaStream_t stream) {
  const bool known = DispatchGgmlType(p.table_type, [&](auto type) {
    SLUICE_LAUNCH(static_cast<unsigned>(p.count), kThreads, 0, stream,
                  GetRowsKernel<decltype(type)::value>)
    (static_cast<const uint8_t*>(p.table), p.ids, p.out, p.rows, p.dim);
  });
  if (!known) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
