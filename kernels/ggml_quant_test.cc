// fp16/bf16 conversions against exhaustive and known values; block dequantization against
// hand-computed blocks.
#include "kernels/ggml_quant.h"

#include <cmath>
#include <cstring>

#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

TEST(GgmlQuant, Fp16KnownValues) {
  EXPECT_EQ(Fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(Fp16ToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(Fp16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(0x7e00)));
  EXPECT_TRUE(std::signbit(Fp16ToFloat(0x8000)));
}

TEST(GgmlQuant, Fp16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf/nan
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToFp16(f), h) << std::hex << h << " -> " << f;
  }
  EXPECT_EQ(FloatToFp16(1e6f), 0x7c00);                          // overflow to inf
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie rounds to even
  EXPECT_EQ(FloatToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(GgmlQuant, Bf16) {
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
  // Every bf16 value comes back from its float exactly (NaN as a NaN).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f))));
    } else {
      ASSERT_EQ(FloatToBf16(f), h) << std::hex << h;
    }
  }
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie rounds to even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie rounds to even
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -7) * 0.75f), 0x3f81);
  EXPECT_EQ(FloatToBf16(3.4e38f), 0x7f80);  // past bf16's largest: inf
}

TEST(GgmlQuant, DequantizeBlocks) {
  BlockQ4_1 b1;
  b1.d = FloatToFp16(0.5f);
  b1.m = FloatToFp16(-1.0f);
  for (int j = 0; j < 16; ++j) b1.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float out[32];
  DequantizeRow(GgmlType::kQ4_1, &b1, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_EQ(out[j + 16], 0.5f * (15 - j) - 1.0f);
  }

  BlockQ4_0 b0;
  b0.d = FloatToFp16(2.0f);
  for (int j = 0; j < 16; ++j) b0.qs[j] = static_cast<uint8_t>(j | (j << 4));
  DequantizeRow(GgmlType::kQ4_0, &b0, out, 32);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(out[j], 2.0f * (j - 8));

  BlockQ8_0 b8[2];
  for (int k = 0; k < 2; ++k) {
    b8[k].d = FloatToFp16(k == 0 ? 0.25f : -1.0f);
    for (int j = 0; j < 32; ++j) b8[k].qs[j] = static_cast<int8_t>(j - 16);
  }
  float out64[64];
  DequantizeRow(GgmlType::kQ8_0, b8, out64, 64);
  EXPECT_EQ(out64[0], -4.0f);
  EXPECT_EQ(out64[31], 3.75f);
  EXPECT_EQ(out64[32], 16.0f);
}

TEST(GgmlQuant, TypeTable) {
  EXPECT_EQ(FindGgmlType(3)->name, "q4_1");
  EXPECT_EQ(FindGgmlType(8)->type_size, 34);
  EXPECT_EQ(FindGgmlType(12), nullptr);
  EXPECT_EQ(GgmlTypeName(12), "type 12");
}

}  // namespace
}  // namespace sluice::kernels
