// The page formats whose slots move (KvMoveSlots, compaction), for the tests of both: fixed-width
// tiers with K grouped per token, tiled along tokens and not, with and without token metadata.
#ifndef SLUICE_KERNELS_TEST_UTIL_SLOT_MOVE_FORMATS_H_
#define SLUICE_KERNELS_TEST_UTIL_SLOT_MOVE_FORMATS_H_

#include <vector>

#include "kernels/kv_format.h"

namespace sluice::kernels::testing {

// `bits`-bit ints per token, in groups of `group` values (0: the whole row).
inline KvQuantSpec IntPerToken(int bits, int group) {
  return {.codec = KvCodec::kInt, .bits = bits, .grouping = KvGrouping::kPerToken, .group = group};
}

inline std::vector<KvTierFormat> SlotMoveFormats() {
  const auto i = IntPerToken;
  return {
      {.head_dim = 64, .page_bytes = 4096},                                // f16
      {.k = i(8, 0), .v = i(8, 0), .head_dim = 64, .page_bytes = 4096},    // int8
      {.k = i(4, 32), .v = i(2, 32), .head_dim = 64, .page_bytes = 4096},  // tiled K
      {.k = i(8, 0), .v = i(4, 32), .head_dim = 64, .page_bytes = 4096, .token_meta = true},
  };
}

}  // namespace sluice::kernels::testing

#endif  // SLUICE_KERNELS_TEST_UTIL_SLOT_MOVE_FORMATS_H_
