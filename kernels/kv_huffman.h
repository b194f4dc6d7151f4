// Huffman-coded KV pages (layout in kernels/kv_format.h): appending a quantized unit to a page,
// decoding a unit back into its fixed-width unit page, and the quantize/dequantize drivers the
// host backends share. The attention kernels decode one unit at a time into an L1-sized unit
// page and run their fixed-width tile loops on it.
#ifndef SLUICE_KERNELS_KV_HUFFMAN_H_
#define SLUICE_KERNELS_KV_HUFFMAN_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "kernels/kv_format.h"
#include "kernels/op_params.h"

namespace sluice::kernels {

// Layouts of one Huffman-coded tier: its pages and its unit pages.
struct KvHuffmanTier {
  KvTierFormat format;
  KvPageLayout layout;       // ComputePageLayout(format)
  KvTierFormat unit_format;  // KvUnitFormat(format)
  KvPageLayout unit_layout;  // ComputeUnitLayout(format)
};
absl::StatusOr<KvHuffmanTier> MakeKvHuffmanTier(const KvTierFormat& format);

// Codes unit page `unit` (all its slots valid) as unit `index` of `page`, after the page's
// units [0, index). Returns false and leaves the page's units as they were if the codes do not
// fit. Scores and positions are the caller's. InvalidArgument for a code outside a codebook.
absl::StatusOr<bool> KvAppendUnit(const KvHuffmanTier& tier, const KvCodebooks& codebooks,
                                  const uint8_t* unit,  // [unit_layout.bytes_used]
                                  int64_t index, uint8_t* page);

// Decodes unit `index` of `page` into `unit` [unit_layout.bytes_used]: codes, metadata, and
// the valid bits of the unit's slots. Table-driven, four streams in lockstep (kernels/huffman.h).
void KvDecodeUnit(const KvHuffmanTier& tier, const KvCodebooks& codebooks, const uint8_t* page,
                  int64_t index, uint8_t* unit);
// The same, one bit at a time by canonical code ranges, without the decode tables: the oracle.
void KvDecodeUnitReference(const KvHuffmanTier& tier, const KvCodebooks& codebooks,
                           const uint8_t* page, int64_t index, uint8_t* unit);

// Checks what KvDecodeUnit and KvDecodeUnitReference trust in a page made elsewhere (a peer's):
// that each of its units [0, units) holds 2 * kKvHuffmanStreams rows of valid codes (K's, then
// V's from the next byte) where its stream offsets say, one unit after another, inside the
// page's bitstream with the decoders' padding after it. DataLoss naming the unit and row
// otherwise; InvalidArgument for more units than the page holds or codebooks that are null.
absl::Status KvCheckUnits(const KvHuffmanTier& tier, const KvCodebooks& codebooks,
                          const uint8_t* page, int64_t units);

// Backend::KvQuantize for a Huffman-coded tier: each unit is quantized by `quantize_unit` (the
// backend's fixed-width quantizer, called on a unit page) and appended while it fits.
absl::Status KvQuantizeHuffman(const KvQuantizeParams& p,
                               absl::FunctionRef<void(const KvQuantizeParams&)> quantize_unit);
// Backend::KvDequantize for a Huffman-coded tier, over units decoded by KvDecodeUnit (or by
// KvDecodeUnitReference with `reference`) and expanded by `dequantize_unit`.
absl::Status KvDequantizeHuffman(
    const KvDequantizeParams& p, bool reference,
    absl::FunctionRef<void(const KvDequantizeParams&)> dequantize_unit);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_KV_HUFFMAN_H_
