// Kernels whose machine code sass_parse_test.py reads, made with CUDA 13.0 in this directory:
//   nvcc -cubin -O3 -gencode arch=compute_90a,code=sm_90a [-lineinfo] snippets.cu (and sm_80)
//   cuobjdump -sass; -res-usage (of nvcc -c with both); nvdisasm -gi -c (the -lineinfo cubin)
#include <cstdint>
// A loop with a runtime 32-bit division and modulo, and a 64-bit division.
__global__ void LoopDiv(const int* a, const int* b, const int64_t* c, int64_t* o, int n, int m) {
#pragma unroll 1
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    o[k] = a[k] / m + a[k] % b[k] + c[k] / c[k + n];
  }
}
// Too few registers for 16 live values across a loop: ptxas spills.
__global__ void __maxnreg__(24) Spill(const float* x, float* o, int n) {
  float v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = x[i * n + threadIdx.x];
  float s = 0.f;
#pragma unroll 1
  for (int j = 0; j < n; ++j) s = s * x[j] + x[j + 1] * x[j + 2];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i * n + threadIdx.x] = v[i] * s;
}
// Loops three deep next to a loop two deep; a warp shuffle in divergent code.
__global__ void Nested(const float* x, float* o, int n, int m) {
  float acc = 0.f;
#pragma unroll 1
  for (int i = 0; i < n; ++i) {
#pragma unroll 1
    for (int j = 0; j < m; ++j) {
#pragma unroll 1
      for (int k = threadIdx.x; k < m; k += 32) acc += x[(i * m + j) * m + k];
    }
#pragma unroll 1
    for (int j = threadIdx.x; j < n; j += 32) acc *= x[j];
  }
  if (threadIdx.x < n) {
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  }
  o[threadIdx.x] = acc;
}
