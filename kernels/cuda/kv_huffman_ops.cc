#include "kernels/cuda/kv_huffman_ops.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kv_huffman.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/kv_huffman.h"

namespace sluice::kernels::cuda {
namespace {

// Device memory freed when it goes out of scope.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Allocate(size_t bytes) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

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
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&d.encoder_, sizeof(enc)));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&d.table_), cb.decode_table.size() * 2));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d.encoder_, &enc, sizeof(enc), cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d.table_, cb.decode_table.data(),
                                              cb.decode_table.size() * 2, cudaMemcpyHostToDevice,
                                              stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // `enc` lives on this stack
  return d;
}

DeviceCodebook::DeviceCodebook(DeviceCodebook&& o) noexcept
    : table_(std::exchange(o.table_, nullptr)),
      encoder_(std::exchange(o.encoder_, nullptr)),
      bits_(o.bits_) {}

DeviceCodebook::~DeviceCodebook() {
  if (table_ != nullptr) cudaFree(table_);
  if (encoder_ != nullptr) cudaFree(encoder_);
}

absl::Status KvQuantizeHuffman(const KvQuantizeParams& p, cudaStream_t stream) {
  SLUICE_ASSIGN_OR_RETURN(const KvHuffmanTier t, MakeKvHuffmanTier(p.format));
  const int64_t u = t.layout.unit_tokens, units = p.tokens / u;
  const int64_t unit_bytes = t.unit_layout.bytes_used;
  SLUICE_ASSIGN_OR_RETURN(DeviceCodebook k, DeviceCodebook::Upload(*p.codebooks.k, stream));
  SLUICE_ASSIGN_OR_RETURN(DeviceCodebook v, DeviceCodebook::Upload(*p.codebooks.v, stream));
  Scratch scratch, job_memory;
  SLUICE_RETURN_IF_ERROR(scratch.Allocate(units * unit_bytes + sizeof(int64_t)));
  SLUICE_RETURN_IF_ERROR(job_memory.Allocate(sizeof(HuffmanEncodeJob)));
  uint8_t* unit_pages = scratch.as<uint8_t>();
  int64_t* written = reinterpret_cast<int64_t*>(unit_pages + units * unit_bytes);
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(unit_pages, 0, units * unit_bytes, stream));
  for (int64_t i = 0; i < units; ++i) {
    SLUICE_CUDA_RETURN_IF_ERROR(LaunchKvQuantize({.k = p.k + i * u * p.stride,
                                                  .v = p.v + i * u * p.stride,
                                                  .stride = p.stride,
                                                  .tokens = u,
                                                  .format = t.unit_format,
                                                  .layout = t.unit_layout,
                                                  .page = unit_pages + i * unit_bytes,
                                                  .slot = 0},
                                                 stream));
  }
  const HuffmanEncodeJob job{.page = p.page,
                             .units = unit_pages,
                             .first_unit = static_cast<int32_t>(p.slot / u),
                             .units_count = static_cast<int32_t>(units),
                             .scores = p.scores,
                             .positions = p.positions,
                             .tokens_written = written};
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(job_memory.as<void>(), &job, sizeof(job), cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(
      LaunchHuffmanEncode(Desc(t), static_cast<const DeviceHuffmanEncoder*>(k.encoder()),
                          static_cast<const DeviceHuffmanEncoder*>(v.encoder()),
                          job_memory.as<const HuffmanEncodeJob>(), 1, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(p.tokens_written, written, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
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
  Scratch scratch, job_memory;
  SLUICE_RETURN_IF_ERROR(scratch.Allocate(units * unit_bytes));
  SLUICE_RETURN_IF_ERROR(job_memory.Allocate(units * sizeof(HuffmanDecodeJob)));
  std::vector<HuffmanDecodeJob> jobs(units);
  for (int64_t i = 0; i < units; ++i) {
    jobs[i] = {.page = p.page,
               .unit = static_cast<int32_t>(u0 + i),
               .out = scratch.as<uint8_t>() + i * unit_bytes};
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(job_memory.as<void>(), jobs.data(),
                                              units * sizeof(HuffmanDecodeJob),
                                              cudaMemcpyHostToDevice, stream));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchHuffmanDecode(Desc(t), k.table(), k.bits(), v.table(), v.bits(),
                                                  job_memory.as<const HuffmanDecodeJob>(),
                                                  static_cast<int32_t>(units), stream));
  for (int64_t s = p.slot; s < p.slot + p.tokens;) {
    const int64_t index = s / u, first = s % u;
    const int64_t n = std::min(u - first, p.slot + p.tokens - s);
    const int64_t at = s - p.slot;
    SLUICE_CUDA_RETURN_IF_ERROR(
        LaunchKvDequantize({.page = scratch.as<uint8_t>() + (index - u0) * unit_bytes,
                            .format = t.unit_format,
                            .layout = t.unit_layout,
                            .slot = first,
                            .tokens = n,
                            .k = p.k + at * d,
                            .v = p.v + at * d},
                           stream));
    s += n;
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // `jobs` and the scratch go
  return absl::OkStatus();
}

}  // namespace sluice::kernels::cuda
