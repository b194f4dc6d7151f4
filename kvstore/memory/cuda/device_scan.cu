#include <cub/device/device_scan.cuh>
#include <cuda/std/functional>

#include "kvstore/memory/cuda/device_scan.h"

namespace sluice::kvstore::cuda {

// cub::DeviceScan::ExclusiveSum accumulates in the input's type (int32 here), which a large
// batch can overflow; ExclusiveScan with plus and an int64 initial value accumulates in int64.

cudaError_t ExclusiveScanTempBytes(int64_t items, size_t* bytes) {
  *bytes = 0;
  return cub::DeviceScan::ExclusiveScan(nullptr, *bytes, static_cast<const int32_t*>(nullptr),
                                        static_cast<int64_t*>(nullptr), ::cuda::std::plus<>{},
                                        int64_t{0}, items);
}

cudaError_t LaunchExclusiveScan(const int32_t* in, int64_t* out, int64_t items, void* temp,
                                size_t temp_bytes, cudaStream_t stream) {
  return cub::DeviceScan::ExclusiveScan(temp, temp_bytes, in, out, ::cuda::std::plus<>{},
                                        int64_t{0}, items, stream);
}

}  // namespace sluice::kvstore::cuda
