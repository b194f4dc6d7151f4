// Device copies of host data for the CUDA tests (real or emulated device memory).
#ifndef SLUICE_KERNELS_CUDA_DEVICE_TESTING_H_
#define SLUICE_KERNELS_CUDA_DEVICE_TESTING_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_array.h"

namespace sluice::kernels::testing {

// A device copy of `host` (at least one element, so that data() is never null); a failed
// allocation or copy fails the calling test and returns an empty array.
template <typename T>
cuda::DeviceArray<T> OnGpu(const std::vector<T>& host) {
  auto a = cuda::DeviceArray<T>::Create(std::max<size_t>(1, host.size()));
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return {};
  EXPECT_EQ(cudaMemcpy(a->data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return std::move(*a);
}

}  // namespace sluice::kernels::testing

#endif  // SLUICE_KERNELS_CUDA_DEVICE_TESTING_H_
