// Exclusive prefix sums on the device with CUB, for batch page allocation and recycling and for
// compaction's per-list offsets: int32 counts in, int64 offsets out, so that a large batch
// cannot overflow the sum. No absl here: nvcc compiles this header.
#ifndef SLUICE_KVSTORE_MEMORY_CUDA_DEVICE_SCAN_H_
#define SLUICE_KVSTORE_MEMORY_CUDA_DEVICE_SCAN_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace sluice::kvstore::cuda {

// Bytes of temporary storage LaunchExclusiveScan needs for `items` items (no device work).
cudaError_t ExclusiveScanTempBytes(int64_t items, size_t* bytes);

// out[i] = in[0] + ... + in[i - 1] for i < items, accumulated in int64. Callers append a 0 to
// `in` so that out[items - 1] is the total. `temp` holds at least ExclusiveScanTempBytes(items)
// bytes of device memory; in and out are device memory and must not overlap.
cudaError_t LaunchExclusiveScan(const int32_t* in,  // [items]
                                int64_t* out,       // [items]
                                int64_t items, void* temp, size_t temp_bytes, cudaStream_t stream);

}  // namespace sluice::kvstore::cuda

#endif  // SLUICE_KVSTORE_MEMORY_CUDA_DEVICE_SCAN_H_
