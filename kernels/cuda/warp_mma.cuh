// Warp-level tensor-core and packed-half helpers for the kernels: one definition for nvcc
// (inline PTX, sm_80 and later) and one for the CPU emulation (kernels/cuda/emu), so a kernel
// that multiplies on the tensor cores runs, and is tested, under both.
//
//   float d[4] = {};                 // C in, D out (fp32, PTX's m16n8k16 accumulator layout)
//   MmaF16(d, a, b);                 // a: four f16x2 (A 16 x 16, row-major), b: two f16x2
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"),
// g = lane / 4, t = lane % 4, low half of a register first:
//   a[0] A[g][2t..2t+1]    a[1] A[g+8][2t..2t+1]    a[2] A[g][2t+8..]    a[3] A[g+8][2t+8..]
//   b[0] B[2t..2t+1][g]    b[1] B[2t+8..2t+9][g]
//   d[0..1] D[g][2t..2t+1]   d[2..3] D[g+8][2t..2t+1]
#ifndef SLUICE_KERNELS_CUDA_WARP_MMA_CUH_
#define SLUICE_KERNELS_CUDA_WARP_MMA_CUH_

#include <cuda_fp16.h>

#include <cstdint>

namespace sluice::kernels::cuda {

// d += A B over one warp (every lane calls it with its fragments).
__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]) {
#ifdef SLUICE_CUDA_EMU
  ::sluice::emu::MmaM16N8K16(a, b, d, __FILE__, __LINE__);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// (a & b) | c as one instruction. Written as C++, ptxas splits it into two LOP3s when b and c
// are both immediates (an instruction takes one); PTX's lop3 keeps it one.
__device__ __forceinline__ uint32_t AndOr(uint32_t a, uint32_t b, uint32_t c) {
#ifdef SLUICE_CUDA_EMU
  return (a & b) | c;
#else
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#endif
}

// Lane-wise a - b of two f16x2.
__device__ __forceinline__ uint32_t SubHalf2(uint32_t a, uint32_t b) {
#ifdef SLUICE_CUDA_EMU
  const auto h = [](uint32_t x, int i) {
    return ::sluice::emu::HalfBitsToFloat(static_cast<uint16_t>(x >> (16 * i)));
  };
  uint32_t r = 0;
  for (int i = 0; i < 2; ++i) {
    r |= uint32_t{::sluice::emu::FloatToHalfBits(h(a, i) - h(b, i))} << (16 * i);
  }
  return r;
#else
  uint32_t d;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#endif
}

// f16x2 {lo, hi}, each rounded to nearest even.
__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
#ifdef SLUICE_CUDA_EMU
  return uint32_t{::sluice::emu::FloatToHalfBits(lo)} | uint32_t{::sluice::emu::FloatToHalfBits(hi)}
                                                            << 16;
#else
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#endif
}

// The low half of an f16x2 as a float.
__device__ __forceinline__ float LowHalf(uint32_t h) {
#ifdef SLUICE_CUDA_EMU
  return ::sluice::emu::HalfBitsToFloat(static_cast<uint16_t>(h & 0xffff));
#else
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffff)));
#endif
}

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_WARP_MMA_CUH_
