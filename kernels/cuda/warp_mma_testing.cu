#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_mma.cuh"
#include "kernels/cuda/warp_mma_testing.h"

namespace sluice::kernels::cuda {
namespace {

// One warp; fragments gathered from row-major arrays in PTX's layout (warp_mma.cuh).
__global__ void MmaCheckKernel(const float* a, const float* b, const float* c,
                               const unsigned* words, float* d) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  uint32_t fa[4], fb[2];
  const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
  for (int i = 0; i < 4; ++i) {
    fa[i] = PackHalf2(a[rows[i] * 16 + cols[i]], a[rows[i] * 16 + cols[i] + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    const int k = 2 * t + 8 * i;
    fb[i] = PackHalf2(b[k * 8 + g], b[(k + 1) * 8 + g]);
  }
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + (i & 1)];
  MmaF16(acc, fa, fb);
  // Low nibbles of bytes 0 and 2 of a word as the halves 1024 + code, then the codes.
  const uint32_t h = SubHalf2(AndOr(words[lane], 0x000F000Fu, 0x64006400u), 0x64006400u);
  acc[0] += LowHalf(h);
  acc[1] += LowHalf(h >> 16);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + (i & 1)] = acc[i];
}

}  // namespace

cudaError_t LaunchMmaCheck(const float* a, const float* b, const float* c, const unsigned* words,
                           float* d, cudaStream_t stream) {
  SLUICE_LAUNCH(1, 32, 0, stream, MmaCheckKernel)(a, b, c, words, d);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
