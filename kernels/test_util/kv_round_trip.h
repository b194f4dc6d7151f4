// The error a KV page codec promises for each value after quantize + dequantize, checked over
// whole rows: used on random inputs (kernels/kv_quant_test) and on real model KV
// (kvstore/kv_quant_real_test).
#ifndef SLUICE_KERNELS_TEST_UTIL_KV_ROUND_TRIP_H_
#define SLUICE_KERNELS_TEST_UTIL_KV_ROUND_TRIP_H_

#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/kv_format.h"

namespace sluice::kernels::testing {

// x: [n, head_dim] original rows (n a multiple of the token group for token-grouped specs);
// y: the same rows after a round trip through `spec`. Each value may be off by half a
// quantization step of its group plus the fp16 rounding of the group's scale and zero (int),
// 2^-4 relative plus the scale's rounding (fp8), or 2^-11 relative (fp16). The failure names
// the first value that is not.
::testing::AssertionResult RoundTripWithinBound(const KvQuantSpec& spec, int32_t head_dim,
                                                const float* x, const float* y, int64_t n);

}  // namespace sluice::kernels::testing

#endif  // SLUICE_KERNELS_TEST_UTIL_KV_ROUND_TRIP_H_
