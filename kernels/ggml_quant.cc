#include "kernels/ggml_quant.h"

#include <cstring>
#include <string>

namespace sluice::kernels {
namespace {

constexpr GgmlTypeTraits kTypes[] = {
    {GgmlType::kF32, "f32", 1, 4},
    {GgmlType::kF16, "f16", 1, 2},
    {GgmlType::kQ4_0, "q4_0", 32, sizeof(BlockQ4_0)},
    {GgmlType::kQ4_1, "q4_1", 32, sizeof(BlockQ4_1)},
    {GgmlType::kQ8_0, "q8_0", 32, sizeof(BlockQ8_0)},
    {GgmlType::kBF16, "bf16", 1, 2},
};

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

}  // namespace

const GgmlTypeTraits* FindGgmlType(uint32_t type) {
  for (const GgmlTypeTraits& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == type) return &t;
  }
  return nullptr;
}

std::string_view GgmlTypeName(uint32_t type) {
  if (const GgmlTypeTraits* t = FindGgmlType(type)) return t->name;
  static thread_local std::string unknown;
  unknown = "type " + std::to_string(type);
  return unknown;
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000 | (mant << 13));  // inf / nan
  if (exp != 0) return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);  // signed zero
  // Subnormal: normalize.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400) == 0);
  return BitsToFloat(sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ff) << 13));
}

uint16_t FloatToFp16(float f) {
  const uint32_t x = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | (abs > 0x7f800000 ? 0x7e00 : 0x7c00);  // nan / inf
  if (abs >= 0x477ff000) return sign | 0x7c00;                                // overflow to inf
  if (abs < 0x38800000) {                                                     // fp16 subnormal
    // Scale so that the fp16 subnormal unit (2^-24) becomes 1, then round to nearest even.
    const float scaled = BitsToFloat(abs) * 16777216.0f;
    const float rounded = __builtin_nearbyintf(scaled);
    return sign | static_cast<uint16_t>(rounded);
  }
  const uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);  // round mantissa to 10 bits
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(s[i]);
      return;
    }
    case GgmlType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(s[i]);
      return;
    }
    case GgmlType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t k = 0; k < n / 32; ++k, dst += 32) {
        const float d = Fp16ToFloat(b[k].d);
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * static_cast<float>((b[k].qs[j] & 0x0f) - 8);
          dst[j + 16] = d * static_cast<float>((b[k].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case GgmlType::kQ4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t k = 0; k < n / 32; ++k, dst += 32) {
        const float d = Fp16ToFloat(b[k].d);
        const float m = Fp16ToFloat(b[k].m);
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * static_cast<float>(b[k].qs[j] & 0x0f) + m;
          dst[j + 16] = d * static_cast<float>(b[k].qs[j] >> 4) + m;
        }
      }
      return;
    }
    case GgmlType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t k = 0; k < n / 32; ++k, dst += 32) {
        const float d = Fp16ToFloat(b[k].d);
        for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(b[k].qs[j]);
      }
      return;
    }
  }
}

}  // namespace sluice::kernels
