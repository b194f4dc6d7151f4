// Device-side decoders of the GGML element types of kernels/ggml_quant.h, bit-exact with the
// host's DequantizeRow: each element is computed with the same roundings (no fused multiply-add
// where the host rounds twice), so embedding lookups match ref exactly. Shared by get_rows.cu
// and the matmul's weight expansion.
#ifndef SLUICE_KERNELS_CUDA_GGML_DEQUANT_CUH_
#define SLUICE_KERNELS_CUDA_GGML_DEQUANT_CUH_

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/ggml_quant.h"

namespace sluice::kernels::cuda {

__device__ __forceinline__ float DecodeFp16(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ float DecodeBf16(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// One GGML type's storage: kBlockSize elements in kTypeSize bytes, and Element(block, j), the
// fp32 value of element j (< kBlockSize) of the block starting at `block`. Blocks of the
// quantized types are 2-byte aligned inside a row (their sizes are even), so the fp16 fields are
// read with 16-bit loads.
template <GgmlType kType>
struct GgmlDecoder;

template <>
struct GgmlDecoder<GgmlType::kF32> {
  static constexpr int kBlockSize = 1;
  static constexpr int kTypeSize = 4;
  __device__ static float Element(const uint8_t* block, int) {
    return *reinterpret_cast<const float*>(block);
  }
};

template <>
struct GgmlDecoder<GgmlType::kF16> {
  static constexpr int kBlockSize = 1;
  static constexpr int kTypeSize = 2;
  __device__ static float Element(const uint8_t* block, int) {
    return DecodeFp16(*reinterpret_cast<const uint16_t*>(block));
  }
};

template <>
struct GgmlDecoder<GgmlType::kBF16> {
  static constexpr int kBlockSize = 1;
  static constexpr int kTypeSize = 2;
  __device__ static float Element(const uint8_t* block, int) {
    return DecodeBf16(*reinterpret_cast<const uint16_t*>(block));
  }
};

// Element j: low nibble of qs[j] for j < 16, high nibble of qs[j - 16] otherwise.
__device__ __forceinline__ int Nibble(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
}

template <>
struct GgmlDecoder<GgmlType::kQ4_0> {
  static constexpr int kBlockSize = 32;
  static constexpr int kTypeSize = sizeof(BlockQ4_0);
  __device__ static float Element(const uint8_t* block, int j) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(block);
    return __fmul_rn(DecodeFp16(b->d), static_cast<float>(Nibble(b->qs, j) - 8));
  }
};

template <>
struct GgmlDecoder<GgmlType::kQ4_1> {
  static constexpr int kBlockSize = 32;
  static constexpr int kTypeSize = sizeof(BlockQ4_1);
  __device__ static float Element(const uint8_t* block, int j) {
    const auto* b = reinterpret_cast<const BlockQ4_1*>(block);
    // d * q + m rounded twice, as the host computes it: no FMA contraction.
    return __fadd_rn(__fmul_rn(DecodeFp16(b->d), static_cast<float>(Nibble(b->qs, j))),
                     DecodeFp16(b->m));
  }
};

template <>
struct GgmlDecoder<GgmlType::kQ8_0> {
  static constexpr int kBlockSize = 32;
  static constexpr int kTypeSize = sizeof(BlockQ8_0);
  __device__ static float Element(const uint8_t* block, int j) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(block);
    return __fmul_rn(DecodeFp16(b->d), static_cast<float>(b->qs[j]));
  }
};

// Element e of a row stored in kType's layout starting at `row`.
template <GgmlType kType>
__device__ __forceinline__ float DequantElement(const uint8_t* row, int64_t e) {
  using D = GgmlDecoder<kType>;
  return D::Element(row + e / D::kBlockSize * D::kTypeSize, static_cast<int>(e % D::kBlockSize));
}

// Bytes of a row of `elements` (a multiple of the block size) elements.
template <GgmlType kType>
constexpr int64_t GgmlRowBytes(int64_t elements) {
  return elements / GgmlDecoder<kType>::kBlockSize * GgmlDecoder<kType>::kTypeSize;
}

// Calls f(std::integral_constant<GgmlType, T>{}) for the runtime `type`; returns false, calling
// nothing, for a type without a decoder.
template <typename F>
bool DispatchGgmlType(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::kF32:
      f(std::integral_constant<GgmlType, GgmlType::kF32>{});
      return true;
    case GgmlType::kF16:
      f(std::integral_constant<GgmlType, GgmlType::kF16>{});
      return true;
    case GgmlType::kBF16:
      f(std::integral_constant<GgmlType, GgmlType::kBF16>{});
      return true;
    case GgmlType::kQ4_0:
      f(std::integral_constant<GgmlType, GgmlType::kQ4_0>{});
      return true;
    case GgmlType::kQ4_1:
      f(std::integral_constant<GgmlType, GgmlType::kQ4_1>{});
      return true;
    case GgmlType::kQ8_0:
      f(std::integral_constant<GgmlType, GgmlType::kQ8_0>{});
      return true;
  }
  return false;
}

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_GGML_DEQUANT_CUH_
