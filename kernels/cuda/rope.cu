#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope.h"

namespace sluice::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride beyond this

// grid-stride over (token, pair) items; each thread computes its pair's angle once and rotates
// that pair in every head of the token. Elements past rope_dim are never touched.
__global__ void __launch_bounds__(kThreads)
    RopeKernel(float* __restrict__ x,                  // [tokens, heads, head_dim]
               const int32_t* __restrict__ positions,  // [tokens]
               int64_t tokens, int64_t heads, int64_t head_dim, int64_t rope_dim, double theta_base,
               bool neox) {
  const int64_t half = rope_dim / 2;
  for (int64_t w = blockIdx.x * int64_t{kThreads} + threadIdx.x; w < tokens * half;
       w += int64_t{gridDim.x} * kThreads) {
    const int64_t t = w / half, i = w % half;
    // As ref::Rope: theta_base^(-2i / rope_dim), in double. The angle goes in half-turns to
    // sincospi, whose range reduction is exact: sincos's reduction of large angles keeps a
    // table on the thread's stack (local memory).
    const double freq =
        pow(theta_base, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
    constexpr double kInvPi = 0.318309886183790671537767526745;
    const double half_turns = static_cast<double>(positions[t]) * (freq * kInvPi);
    double s, c;
    sincospi(half_turns, &s, &c);
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    float* xt = x + t * heads * head_dim;
    for (int64_t h = 0; h < heads; ++h, xt += head_dim) {
      const double x0 = xt[a], x1 = xt[b];
      xt[a] = static_cast<float>(x0 * c - x1 * s);
      xt[b] = static_cast<float>(x0 * s + x1 * c);
    }
  }
}

}  // namespace

cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream) {
  const int64_t work = p.tokens * (p.rope_dim / 2);
  if (work == 0) return cudaSuccess;
  const unsigned blocks =
      static_cast<unsigned>(std::min(kMaxBlocks, (work + kThreads - 1) / kThreads));
  SLUICE_LAUNCH(blocks, kThreads, 0, stream, RopeKernel)
  (p.x, p.positions, p.tokens, p.heads, p.head_dim, p.rope_dim, static_cast<double>(p.theta_base),
   p.neox);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
