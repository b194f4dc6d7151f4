#include "kernels/test_util/kv_round_trip.h"

#include <algorithm>
#include <cmath>

namespace sluice::kernels::testing {

::testing::AssertionResult RoundTripWithinBound(const KvQuantSpec& spec, int32_t head_dim,
                                                const float* x, const float* y, int64_t n) {
  const int64_t d = head_dim;
  const int gs = KvGroupOf(spec, head_dim);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      // The extent of the value's quantization group.
      float lo = x[t * d + c], hi = lo;
      if (spec.codec != KvCodec::kF16) {
        if (spec.grouping == KvGrouping::kPerToken) {
          for (int64_t j = c / gs * gs; j < (c / gs + 1) * gs; ++j) {
            lo = std::min(lo, x[t * d + j]);
            hi = std::max(hi, x[t * d + j]);
          }
        } else {
          const int bc = spec.grouping == KvGrouping::kBlock ? spec.block_channels : 1;
          for (int64_t s = t / gs * gs; s < (t / gs + 1) * gs; ++s) {
            for (int64_t j = c / bc * bc; j < (c / bc + 1) * bc; ++j) {
              lo = std::min(lo, x[s * d + j]);
              hi = std::max(hi, x[s * d + j]);
            }
          }
        }
      }
      const float xv = x[t * d + c], amax = std::max(std::fabs(lo), std::fabs(hi));
      float bound;
      switch (spec.codec) {
        case KvCodec::kF16:
          bound = std::ldexp(std::fabs(xv), -11) + 1e-7f;
          break;
        case KvCodec::kFp8:  // 3 mantissa bits, plus the fp16 scale's rounding
          bound = std::ldexp(std::fabs(xv), -4) + std::ldexp(amax, -9) + 1e-6f;
          break;
        default:  // half a step, plus fp16 rounding of scale and zero
          bound = 0.5f * (hi - lo) / KvMaxCode(spec) * (1 + 1e-3f) + std::ldexp(amax, -10) + 1e-6f;
      }
      const float err = std::fabs(y[t * d + c] - xv);
      if (!(err <= bound)) {
        return ::testing::AssertionFailure()
               << "token " << t << " channel " << c << ": " << xv << " came back " << y[t * d + c]
               << " (error " << err << " > bound " << bound << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace sluice::kernels::testing
