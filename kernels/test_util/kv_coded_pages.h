// Huffman-coded KV pages for tests: codebooks built from sample rows' codes, and pages filled by
// the reference quantizer.
#ifndef SLUICE_KERNELS_TEST_UTIL_KV_CODED_PAGES_H_
#define SLUICE_KERNELS_TEST_UTIL_KV_CODED_PAGES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/huffman.h"
#include "kernels/kv_format.h"
#include "kernels/op_params.h"

namespace sluice::kernels::testing {

// K and V codebooks that own their tables; `view` points into them.
struct OwnedCodebooks {
  HuffmanCodebook k, v;
  KvCodebooks view() const { return {.k = &k, .v = &v}; }
};

// Codebooks for the Huffman-coded `format` from the codes its unit format gives rows k and v
// ([n, head_dim], n a multiple of the unit).
absl::StatusOr<std::unique_ptr<OwnedCodebooks>> CodebooksFromRows(const KvTierFormat& format,
                                                                  const float* k, const float* v,
                                                                  int64_t n);

// Writes rows k and v ([n, head_dim]) into `page` from slot `slot` with the reference quantizer;
// returns the tokens written (whole units, as many as fit).
absl::StatusOr<int64_t> RefCodedWrite(const KvTierFormat& format, const KvCodebooks& codebooks,
                                      const float* k, const float* v, int64_t n, int64_t slot,
                                      uint8_t* page);

}  // namespace sluice::kernels::testing

#endif  // SLUICE_KERNELS_TEST_UTIL_KV_CODED_PAGES_H_
