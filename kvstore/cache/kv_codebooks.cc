#include "kvstore/cache/kv_codebooks.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace sluice::kvstore {

absl::StatusOr<KvCodebookPair> BuildKvCodebooks(kernels::Backend& backend,
                                                const kernels::KvTierFormat& format, const float* k,
                                                const float* v, int64_t stride, int64_t tokens,
                                                uint32_t k_id) {
  if (format.huffman_bits <= 0.f) {
    return absl::InvalidArgumentError(absl::StrCat(kernels::KvTierFormatName(format),
                                                   " is not Huffman-coded; it has no codebooks"));
  }
  // The codes come from the fixed-width format the units decode into, quantized a page at a
  // time; every code byte of the quantized tokens counts once.
  const kernels::KvTierFormat fixed = kernels::KvUnitFormat(format);
  SLUICE_ASSIGN_OR_RETURN(const kernels::KvPageLayout fl, kernels::ComputePageLayout(fixed));
  const int64_t d = format.head_dim;
  std::vector<uint64_t> k_hist(kernels::KvMaxCode(fixed.k) + 1),
      v_hist(kernels::KvMaxCode(fixed.v) + 1);
  std::vector<uint8_t> page(fixed.page_bytes);
  for (int64_t t0 = 0; t0 + fl.token_group <= tokens; t0 += fl.tokens) {
    const int64_t n = std::min<int64_t>(fl.tokens, (tokens - t0) / fl.token_group * fl.token_group);
    // Host memory: Huffman-coded pages are built on host backends only.
    const int64_t span = (n - 1) * stride + d;
    SLUICE_RETURN_IF_ERROR(backend.KvQuantize({.k = kernels::HostView(k + t0 * stride, span),
                                               .v = kernels::HostView(v + t0 * stride, span),
                                               .stride = stride,
                                               .tokens = n,
                                               .format = fixed,
                                               .layout = fl,
                                               .page = kernels::HostView(page)}));
    for (int64_t i = 0; i < n * d; ++i) {
      k_hist[page[fl.k_codes + i]]++;
      v_hist[page[fl.v_codes + i]]++;
    }
  }
  KvCodebookPair out;
  SLUICE_ASSIGN_OR_RETURN(out.k, kernels::BuildHuffmanCodebook(k_id, k_hist));
  SLUICE_ASSIGN_OR_RETURN(out.v, kernels::BuildHuffmanCodebook(k_id + 1, v_hist));
  return out;
}

}  // namespace sluice::kvstore
