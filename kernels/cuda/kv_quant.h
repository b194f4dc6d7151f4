// CUDA quantizer and dequantizer of KV pages: byte-identical pages to ref::KvQuantize (same
// group parameters, round-half-even, fp16 and fp8 conversions).
#ifndef SLUICE_KERNELS_CUDA_KV_QUANT_H_
#define SLUICE_KERNELS_CUDA_KV_QUANT_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// Enqueue on `stream`; parameters must be valid, data pointers in device memory.
cudaError_t LaunchKvQuantize(const KvQuantizeParams& p, cudaStream_t stream);
cudaError_t LaunchKvDequantize(const KvDequantizeParams& p, cudaStream_t stream);

// Many fixed-width writes in one launch (Backend::KvQuantizeBatch; a decode step writes one token
// per sequence, layer and kv-head, and LaunchKvQuantize launches three kernels a write). The
// host plans the batch into one image (the distinct formats, one job per write, each job's first
// block); the launch copies it to the device and runs one block per kThreads units of work.
struct KvQuantizeFormat {
  KvTierFormat format;
  KvPageLayout layout;
};
struct KvQuantizeJob {
  const float* k;            // [tokens, stride]
  const float* v;            // [tokens, stride]
  const float* scores;       // [tokens] or null
  const int32_t* positions;  // [tokens] or null
  uint8_t* page;
  int64_t stride;
  int64_t tokens;
  int64_t slot;
  int32_t format;  // index into the image's formats
};
struct KvQuantizeBatchImage {
  std::vector<uint8_t> bytes;  // formats, jobs, first blocks [count + 1]; 16-byte aligned each
  size_t formats_at = 0, jobs_at = 0, first_block_at = 0;
  int64_t count = 0;   // jobs (items with tokens)
  int64_t blocks = 0;  // the launch's grid
};

// Items must be validated writes to distinct pages; those of no tokens and those of
// Huffman-coded tiers (KvQuantizeHuffman's) are skipped.
KvQuantizeBatchImage PlanKvQuantizeBatch(const KvQuantizeParams* items, int64_t count);
// device_image: image.bytes.size() bytes of device memory, free until the kernel has run (stream
// order). Nothing is launched for an empty batch.
cudaError_t LaunchKvQuantizeBatch(const KvQuantizeBatchImage& image, uint8_t* device_image,
                                  cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_KV_QUANT_H_
