// CUDA coding of Huffman-coded KV pages (layout in kernels/kv_format.h), byte-identical to
// kernels/kv_huffman.h on the host.
//  - Encode (KVComp §3.2.2): one block per page; for each unit, a block reduction of the code
//    lengths decides whether the unit fits, a block scan of the lengths gives every symbol its
//    bit offset, and threads OR their codes into the zeroed bitstream. The page's bitstream
//    offset advances once per unit: the one serial step.
//  - Decode: one block per unit, 16 threads per stream (four K and four V streams per unit),
//    one table lookup and one add per symbol (huffman_unit.cuh).
// No absl here: launchers return cudaError_t; the backend turns them into Status.
#ifndef SLUICE_KERNELS_CUDA_KV_HUFFMAN_H_
#define SLUICE_KERNELS_CUDA_KV_HUFFMAN_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/kv_format.h"

namespace sluice::kernels::cuda {

// A codebook's encoder half, as device memory holds it.
struct DeviceHuffmanEncoder {
  uint8_t lengths[256];  // 0 outside the alphabet
  uint16_t codes[256];   // HuffmanCodebook::codes: bit-reversed for LSB-first packing
};

// The tier as both directions need it.
struct HuffmanTierDesc {
  KvTierFormat format;
  KvPageLayout layout;
  KvTierFormat unit_format;
  KvPageLayout unit_layout;
};

// Appends units to one page: `units` quantized unit pages (unit_layout.bytes_used apart) as
// units first_unit, first_unit + 1, ... while they fit.
struct HuffmanEncodeJob {
  uint8_t* page = nullptr;         // [page_bytes]
  const uint8_t* units = nullptr;  // [units, unit_layout.bytes_used]
  int32_t first_unit = 0;
  int32_t units_count = 0;
  const float* scores = nullptr;       // [units * U] or null (token_meta tiers)
  const int32_t* positions = nullptr;  // [units * U] or null
  int64_t* tokens_written = nullptr;   // device, one value
};

// Decodes unit `unit` of `page` into the fixed-width unit page `out`.
struct HuffmanDecodeJob {
  const uint8_t* page = nullptr;
  int32_t unit = 0;
  uint8_t* out = nullptr;  // [unit_layout.bytes_used]
};

cudaError_t LaunchHuffmanEncode(const HuffmanTierDesc& tier, const DeviceHuffmanEncoder* k,
                                const DeviceHuffmanEncoder* v,  // device
                                const HuffmanEncodeJob* jobs,   // device [job_count]
                                int32_t job_count, cudaStream_t stream);

cudaError_t LaunchHuffmanDecode(const HuffmanTierDesc& tier,
                                const uint16_t* k_table,  // device [1 << k_bits]
                                int32_t k_bits, const uint16_t* v_table, int32_t v_bits,
                                const HuffmanDecodeJob* jobs,  // device [job_count]
                                int32_t job_count, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_KV_HUFFMAN_H_
