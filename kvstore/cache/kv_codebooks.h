// Per-layer Huffman codebooks of a Huffman-coded KV format (kvcomp), built from the histogram of
// the codes some rows quantize to: in the cache, the first tokens a layer compresses (the
// prompt's, in prefill).
#ifndef SLUICE_KVSTORE_CACHE_KV_CODEBOOKS_H_
#define SLUICE_KVSTORE_CACHE_KV_CODEBOOKS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/huffman.h"
#include "kernels/kv_format.h"
#include "kernels/op_params.h"

namespace sluice::kvstore {

struct KvCodebookPair {
  kernels::HuffmanCodebook k, v;
  kernels::KvCodebooks view() const { return {.k = &k, .v = &v}; }
};

// Codebooks (ids k_id and k_id + 1) for the Huffman-coded `format` from the codes that rows
// k and v ([tokens, stride], head_dim values opening each row) quantize to on `backend` (host
// memory). Every level gets a code, seen or not. InvalidArgument if `format` is not
// Huffman-coded.
absl::StatusOr<KvCodebookPair> BuildKvCodebooks(kernels::Backend& backend,
                                                const kernels::KvTierFormat& format, const float* k,
                                                const float* v, int64_t stride, int64_t tokens,
                                                uint32_t k_id);

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_CACHE_KV_CODEBOOKS_H_
