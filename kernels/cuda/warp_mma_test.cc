// MmaF16 and the packed-half helpers of kernels/cuda/warp_mma.cuh against a scalar product on
// fresh random inputs: under the emulation in CI, on the tensor cores where a GPU is.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/device_testing.h"
#include "kernels/cuda/warp_mma_testing.h"
#include "kernels/test_util/backend_cases.h"

namespace sluice::kernels::cuda {
namespace {

// fp16 round to nearest even of a value well inside the normal range (the test's inputs).
float ToHalf(float x) {
  int e = 0;
  std::frexp(x, &e);
  const float ulp = std::ldexp(1.f, e - 11);
  return std::nearbyint(x / ulp) * ulp;
}

using testing::OnGpu;

TEST(WarpMma, MatchesAScalarProductInPtxLayout) {
  if (absl::Status gpu = CudaDeviceAvailable(); !gpu.ok()) GTEST_SKIP() << gpu;
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  const std::vector<float> a = testing::RandomFloats(rng, 16 * 16, 0.5f, 2);
  const std::vector<float> b = testing::RandomFloats(rng, 16 * 8, -2, -0.5f);
  const std::vector<float> c = testing::RandomFloats(rng, 16 * 8, -1, 1);
  std::vector<unsigned> words(32);
  for (unsigned& w : words) w = static_cast<unsigned>(rng());
  const DeviceArray<float> da = OnGpu(a), db = OnGpu(b), dc = OnGpu(c);
  const DeviceArray<unsigned> dw = OnGpu(words);
  const DeviceArray<float> dd = OnGpu(std::vector<float>(16 * 8, NAN));
  ASSERT_EQ(LaunchMmaCheck(da.data(), db.data(), dc.data(), dw.data(), dd.data(), nullptr),
            cudaSuccess);
  std::vector<float> got(16 * 8);
  ASSERT_EQ(cudaMemcpy(got.data(), dd.data(), got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> want(16 * 8);
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      double s = c[m * 8 + n];
      for (int k = 0; k < 16; ++k) s += double{ToHalf(a[m * 16 + k])} * ToHalf(b[k * 8 + n]);
      want[m * 8 + n] = static_cast<float>(s);
    }
  }
  // The codes: lane l = 4 g + t adds the low nibbles of bytes 0 and 2 of its word to D[g][2t]
  // and D[g][2t + 1].
  for (int lane = 0; lane < 32; ++lane) {
    want[(lane / 4) * 8 + 2 * (lane % 4)] += static_cast<float>(words[lane] & 0xf);
    want[(lane / 4) * 8 + 2 * (lane % 4) + 1] += static_cast<float>((words[lane] >> 16) & 0xf);
  }
  testing::ExpectNear(got, want, {1e-4f}, 1e-4f, "d");
}

}  // namespace
}  // namespace sluice::kernels::cuda
