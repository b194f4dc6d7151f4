// Backend::KvQuantize and Backend::KvDequantize for Huffman-coded tiers on the GPU: the unit
// pages are quantized by the fixed-width kernels, then coded or decoded by kernels/cuda/
// kv_huffman.h. Codebooks come from host memory and are uploaded per call.
#ifndef SLUICE_KERNELS_CUDA_KV_HUFFMAN_OPS_H_
#define SLUICE_KERNELS_CUDA_KV_HUFFMAN_OPS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/kv_huffman.h"
#include "kernels/huffman.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// Data pointers in device memory; p.tokens_written and the codebooks in host memory. Returns
// once the page is written (synchronizes `stream`).
absl::Status KvQuantizeHuffman(const KvQuantizeParams& p, cudaStream_t stream);
absl::Status KvDequantizeHuffman(const KvDequantizeParams& p, cudaStream_t stream);

// A codebook's decode table in device memory, and its encoder half; freed with the object.
class DeviceCodebook {
 public:
  static absl::StatusOr<DeviceCodebook> Upload(const HuffmanCodebook& codebook,
                                               cudaStream_t stream);

  const uint16_t* table() const { return table_.data(); }
  int bits() const { return bits_; }
  const DeviceHuffmanEncoder* encoder() const { return encoder_.data(); }

 private:
  DeviceCodebook() = default;
  DeviceArray<uint16_t> table_;
  DeviceArray<DeviceHuffmanEncoder> encoder_;
  int bits_ = 0;
};

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_KV_HUFFMAN_OPS_H_
