#include "kernels/test_util/kv_coded_pages.h"

#include "common/status_macros.h"
#include "kernels/kv_huffman.h"
#include "kernels/ref/kv_quant.h"

namespace sluice::kernels::testing {

absl::StatusOr<std::unique_ptr<OwnedCodebooks>> CodebooksFromRows(const KvTierFormat& format,
                                                                  const float* k, const float* v,
                                                                  int64_t n) {
  SLUICE_ASSIGN_OR_RETURN(const KvHuffmanTier tier, MakeKvHuffmanTier(format));
  const KvPageLayout& ul = tier.unit_layout;
  const int64_t u = ul.tokens, d = format.head_dim;
  std::vector<uint64_t> kh(KvMaxCode(format.k) + 1), vh(KvMaxCode(format.v) + 1);
  std::vector<uint8_t> unit(ul.bytes_used);
  for (int64_t t0 = 0; t0 + u <= n; t0 += u) {
    ref::KvQuantize({.k = HostView(k + t0 * d, u * d),
                     .v = HostView(v + t0 * d, u * d),
                     .stride = d,
                     .tokens = u,
                     .format = tier.unit_format,
                     .layout = ul,
                     .page = HostView(unit)});
    for (int64_t i = 0; i < u * d; ++i) {
      kh[unit[ul.k_codes + i]]++;
      vh[unit[ul.v_codes + i]]++;
    }
  }
  auto out = std::make_unique<OwnedCodebooks>();
  SLUICE_ASSIGN_OR_RETURN(out->k, BuildHuffmanCodebook(1, kh));
  SLUICE_ASSIGN_OR_RETURN(out->v, BuildHuffmanCodebook(2, vh));
  return out;
}

absl::StatusOr<int64_t> RefCodedWrite(const KvTierFormat& format, const KvCodebooks& codebooks,
                                      const float* k, const float* v, int64_t n, int64_t slot,
                                      uint8_t* page) {
  SLUICE_ASSIGN_OR_RETURN(const KvPageLayout layout, ComputePageLayout(format));
  int64_t written = 0;
  SLUICE_RETURN_IF_ERROR(KvQuantizeHuffman({.k = HostView(k, n * format.head_dim),
                                            .v = HostView(v, n * format.head_dim),
                                            .stride = format.head_dim,
                                            .tokens = n,
                                            .format = format,
                                            .layout = layout,
                                            .page = HostView(page, format.page_bytes),
                                            .slot = slot,
                                            .codebooks = codebooks,
                                            .tokens_written = &written},
                                           [](const KvQuantizeParams& p) { ref::KvQuantize(p); }));
  return written;
}

}  // namespace sluice::kernels::testing
