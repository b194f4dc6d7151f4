#include "kernels/cuda/kv_huffman_ops.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/kv_huffman.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/kv_huffman.h"

namespace sluice::kernels::cuda {
namespace {

HuffmanTierDesc Desc(const KvHuffmanTier& t) {
  return {.format = t.format,
          .layout = t.layout,
          .unit_format = t.unit_format,
          .unit_layout = t.unit_layout};
}

}  // namespace

absl::StatusOr<DeviceCodebook> DeviceCodebook::Upload(const HuffmanCodebook& cb,
                                                      cudaStream_t stream) {
  if (cb.decode_table.size() != (size_t{1} << cb.max_length)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codebook %d has no decode table of 2^%d entries", cb.id, cb.max_length));
  }
  DeviceCodebook d;
  d.bits_ = cb.max_length;
  DeviceHuffmanEncoder enc;
  std::memcpy(enc.lengths, cb.lengths.data(), sizeof(enc.lengths));
  std::memcpy(enc.codes, cb.codes.data(), sizeof(enc.codes));
  SLUICE_ASSIGN_OR_RETURN(d.encoder_, DeviceArray<DeviceHuffmanEncoder>::Create(1));
  SLUICE_ASSIGN_OR_RETURN(d.table_, DeviceArray<uint16_t>::Create(cb.decode_table.size()));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d.encoder_.data(), &enc, sizeof(enc), cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d.table_.data(), cb.decode_table.data(),
                                              d.table_.bytes(), cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // `enc` lives on this stack
  return d;
}

absl::Status KvQuantizeHuffman(const KvQuantizeParams& p, cudaStream_t stream) {
  SLUICE_ASSIGN_OR_RETURN(const KvHuffmanTier t, MakeKvHuffmanTier(p.format));
  const int64_t u = t.layout.unit_tokens, units = p.tokens / u;
  const int64_t unit_bytes = t.unit_layout.bytes_used;
  SLUICE_ASSIGN_OR_RETURN(DeviceCodebook k, DeviceCodebook::Upload(*p.codebooks.k, stream));
  SLUICE_ASSIGN_OR_RETURN(DeviceCodebook v, DeviceCodebook::Upload(*p.codebooks.v, stream));
  SLUICE_ASSIGN_OR_RETURN(auto scratch, DeviceArray<uint8_t>::Create(units * unit_bytes));
  SLUICE_ASSIGN_OR_RETURN(auto written, DeviceArray<int64_t>::Create(1));
  SLUICE_ASSIGN_OR_RETURN(auto job_memory, DeviceArray<HuffmanEncodeJob>::Create(1));
  uint8_t* unit_pages = scratch.data();
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(unit_pages, 0, units * unit_bytes, stream));
  for (int64_t i = 0; i < units; ++i) {
    SLUICE_CUDA_RETURN_IF_ERROR(LaunchKvQuantize({.k = p.k.subview(i * u * p.stride),
                                                  .v = p.v.subview(i * u * p.stride),
                                                  .stride = p.stride,
                                                  .tokens = u,
                                                  .format = t.unit_format,
                                                  .layout = t.unit_layout,
                                                  .page = {.data = unit_pages + i * unit_bytes,
                                                           .size = unit_bytes,
                                                           .space = MemorySpace::kDevice},
                                                  .slot = 0},
                                                 stream));
  }
  const HuffmanEncodeJob job{.page = p.page.data,
                             .units = unit_pages,
                             .first_unit = static_cast<int32_t>(p.slot / u),
                             .units_count = static_cast<int32_t>(units),
                             .scores = p.scores.data,
                             .positions = p.positions.data,
                             .tokens_written = written.data()};
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(job_memory.data(), &job, sizeof(job), cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(
      LaunchHuffmanEncode(Desc(t), k.encoder(), v.encoder(), job_memory.data(), 1, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p.tokens_written, written.data(), sizeof(int64_t),
                                              cudaMemcpyDeviceToHost, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status KvDequantizeHuffman(const KvDequantizeParams& p, cudaStream_t stream) {
  SLUICE_ASSIGN_OR_RETURN(const KvHuffmanTier t, MakeKvHuffmanTier(p.format));
  const int64_t u = t.layout.unit_tokens, d = p.format.head_dim;
  const int64_t unit_bytes = t.unit_layout.bytes_used;
  const int64_t u0 = p.slot / u, u1 = (p.slot + p.tokens - 1) / u;
  const int64_t units = u1 - u0 + 1;
  SLUICE_ASSIGN_OR_RETURN(DeviceCodebook k, DeviceCodebook::Upload(*p.codebooks.k, stream));
  SLUICE_ASSIGN_OR_RETURN(DeviceCodebook v, DeviceCodebook::Upload(*p.codebooks.v, stream));
  SLUICE_ASSIGN_OR_RETURN(auto scratch, DeviceArray<uint8_t>::Create(units * unit_bytes));
  SLUICE_ASSIGN_OR_RETURN(auto job_memory, DeviceArray<HuffmanDecodeJob>::Create(units));
  std::vector<HuffmanDecodeJob> jobs(units);
  for (int64_t i = 0; i < units; ++i) {
    jobs[i] = {.page = p.page.data,
               .unit = static_cast<int32_t>(u0 + i),
               .out = scratch.data() + i * unit_bytes};
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(job_memory.data(), jobs.data(),
                                              units * sizeof(HuffmanDecodeJob),
                                              cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchHuffmanDecode(Desc(t), k.table(), k.bits(), v.table(), v.bits(),
                                                  job_memory.data(), static_cast<int32_t>(units),
                                                  stream));
  for (int64_t s = p.slot; s < p.slot + p.tokens;) {
    const int64_t index = s / u, first = s % u;
    const int64_t n = std::min(u - first, p.slot + p.tokens - s);
    const int64_t at = s - p.slot;
    SLUICE_CUDA_RETURN_IF_ERROR(
        LaunchKvDequantize({.page = {.data = scratch.data() + (index - u0) * unit_bytes,
                                     .size = unit_bytes,
                                     .space = MemorySpace::kDevice},
                            .format = t.unit_format,
                            .layout = t.unit_layout,
                            .slot = first,
                            .tokens = n,
                            .k = p.k.subview(at * d),
                            .v = p.v.subview(at * d)},
                           stream));
    s += n;
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // `jobs` and the scratch go
  return absl::OkStatus();
}

}  // namespace sluice::kernels::cuda
