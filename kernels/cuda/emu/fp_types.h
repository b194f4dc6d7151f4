// cuda_fp16.h, cuda_bf16.h and cuda_fp8.h for the emulation: the storage types and the
// conversions the kernels use, bit-exact with the device's (round to nearest even; fp8 E4M3
// with saturation to +-448 and 0x7f as NaN, as __nv_cvt_float_to_fp8 does).
#ifndef SLUICE_KERNELS_CUDA_EMU_FP_TYPES_H_
#define SLUICE_KERNELS_CUDA_EMU_FP_TYPES_H_

#include <bit>
#include <cmath>
#include <cstdint>

struct __half_raw {
  unsigned short x;
};
struct __half {
  unsigned short __x;
  __half() = default;
  constexpr __half(__half_raw r) : __x(r.x) {}  // NOLINT: implicit, as in CUDA
  constexpr operator __half_raw() const { return __half_raw{__x}; }
};
struct __nv_bfloat16_raw {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}  // NOLINT
  constexpr operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
struct alignas(4) __half2 {
  __half x, y;
};

typedef unsigned char __nv_fp8_storage_t;
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };

namespace sluice::emu {

// float -> IEEE binary16, round to nearest even.
inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // under half the smallest
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value = m * 2^(e - 150); subnormal units are 2^-24
    const uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    const uint32_t r = q + (rem > halfway || (rem == halfway && (q & 1)));
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t rebased = abs - 0x38000000u;  // exponent bias 127 -> 15
  const uint32_t q = rebased >> 13, rem = rebased & 0x1fffu;
  const uint32_t r = q + (rem > 0x1000u || (rem == 0x1000u && (q & 1)));
  return static_cast<uint16_t>(sign | r);
}

inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

inline uint16_t FloatToBf16Bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // canonical NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

inline float Bf16BitsToFloat(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

// Rounds |a| (finite, >= 0) to a float with `mbits` mantissa bits and minimum normal exponent
// `emin`, to nearest even.
inline float RoundToFormat(float a, int mbits, int emin) {
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  e = (e - 1) < emin ? emin : e - 1;
  const float quantum = std::ldexp(1.f, e - mbits);
  return std::nearbyint(a / quantum) * quantum;  // the default rounding mode: nearest even
}

inline uint8_t FloatToE4m3(float f, bool saturate) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return 0x7f;
  float a = std::fabs(f);
  if (std::isinf(a) && !saturate) return static_cast<uint8_t>(sign | 0x7f);
  a = RoundToFormat(std::fmin(a, 1e30f), 3, -6);
  if (a > 448.f) {
    if (!saturate) return static_cast<uint8_t>(sign | 0x7f);
    a = 448.f;
  }
  if (a < std::ldexp(1.f, -6)) {  // subnormal: multiples of 2^-9
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(a * 512.f));
  }
  int e;
  const float fr = std::frexp(a, &e);  // a = fr * 2^e
  const int mant = static_cast<int>((fr * 2.f - 1.f) * 8.f);
  return static_cast<uint8_t>(sign | ((e - 1 + 7) << 3) | mant);
}

inline uint16_t E4m3ToHalfBits(uint8_t b) {
  const uint16_t sign = static_cast<uint16_t>((b & 0x80) << 8);
  const int e = (b >> 3) & 0xf, m = b & 7;
  if (e == 15 && m == 7) return static_cast<uint16_t>(sign | 0x7fff);  // NaN
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                   : std::ldexp(1.f + static_cast<float>(m) / 8.f, e - 7);
  return static_cast<uint16_t>(sign | FloatToHalfBits(v));
}

inline uint8_t FloatToE5m2(float f, bool saturate) {
  if (std::isnan(f)) return 0x7f;
  uint16_t h = FloatToHalfBits(RoundToFormat(std::fabs(f), 2, -14));
  if ((h & 0x7fff) > 0x7b00) h = saturate ? 0x7b00 : 0x7c00;  // 57344 is the largest finite
  return static_cast<uint8_t>((std::signbit(f) ? 0x80 : 0) | (h >> 8));
}

}  // namespace sluice::emu

inline __half __float2half_rn(float f) { return __half_raw{sluice::emu::FloatToHalfBits(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return sluice::emu::HalfBitsToFloat(h.__x); }
inline __half __ushort_as_half(unsigned short u) { return __half_raw{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16_raw{sluice::emu::FloatToBf16Bits(f)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return sluice::emu::Bf16BitsToFloat(b.__x); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16_raw{u}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat,
                                                __nv_fp8_interpretation_t kind) {
  return kind == __NV_E4M3 ? sluice::emu::FloatToE4m3(x, sat == __NV_SATFINITE)
                           : sluice::emu::FloatToE5m2(x, sat == __NV_SATFINITE);
}
inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t kind) {
  if (kind == __NV_E5M2) return __half_raw{static_cast<unsigned short>(x << 8)};
  return __half_raw{sluice::emu::E4m3ToHalfBits(x)};
}

#endif  // SLUICE_KERNELS_CUDA_EMU_FP_TYPES_H_
