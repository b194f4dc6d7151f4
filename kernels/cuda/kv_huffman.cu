#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/huffman_unit.cuh"
#include "kernels/cuda/kv_huffman.h"
#include "kernels/cuda/launch.cuh"

namespace sluice::kernels::cuda {
namespace {

constexpr int kEncodeThreads = 256;
constexpr int kStreamsPerUnit = 2 * kKvHuffmanStreams;
constexpr int kPaddingBytes = 8;  // HuffmanPaddingBytes()

using BlockScan = cub::BlockScan<uint32_t, kEncodeThreads>;
using BlockReduce = cub::BlockReduce<uint32_t, kEncodeThreads>;

// Writes `count` symbols' codes (a K or V half of a unit) from bit `base` of `bits`, and the bit
// offset of each of its kKvHuffmanStreams streams to streams[0..]. Returns the bits written (all
// threads). The bytes the codes land in must be zero.
__device__ uint32_t EncodeHalf(const DeviceHuffmanEncoder& enc, const uint8_t* symbols, int count,
                               uint32_t base, uint32_t* words, uint32_t* streams,
                               BlockScan::TempStorage& scan) {
  // Each thread codes a contiguous run of symbols, so a stream boundary is at a run's start or
  // inside one run.
  const int per = (count + kEncodeThreads - 1) / kEncodeThreads;
  const int begin = min(count, static_cast<int>(threadIdx.x) * per);
  const int end = min(count, begin + per);
  const int stream_len = count / kKvHuffmanStreams;
  uint32_t local = 0;
  for (int i = begin; i < end; ++i) local += enc.lengths[symbols[i]];
  uint32_t offset = 0, total = 0;
  BlockScan(scan).ExclusiveSum(local, offset, total);
  uint32_t pos = base + offset;
  for (int i = begin; i < end; ++i) {
    if (i % stream_len == 0) streams[i / stream_len] = pos;
    const uint32_t len = enc.lengths[symbols[i]], code = enc.codes[symbols[i]];
    const uint32_t shift = pos & 31;
    atomicOr(words + (pos >> 5), code << shift);
    if (shift + len > 32) atomicOr(words + (pos >> 5) + 1, code >> (32 - shift));
    pos += len;
  }
  __syncthreads();  // the scan storage is reused by the caller
  return total;
}

__device__ uint32_t BlockBits(const DeviceHuffmanEncoder& enc, const uint8_t* symbols, int count,
                              BlockReduce::TempStorage& reduce, uint32_t* shared_total) {
  uint32_t local = 0;
  for (int i = threadIdx.x; i < count; i += kEncodeThreads) local += enc.lengths[symbols[i]];
  const uint32_t total = BlockReduce(reduce).Sum(local);
  if (threadIdx.x == 0) *shared_total = total;
  __syncthreads();
  const uint32_t t = *shared_total;
  __syncthreads();
  return t;
}

// One block per job (page).
__global__ void __launch_bounds__(kEncodeThreads)
    EncodeKernel(const HuffmanTierDesc tier, const DeviceHuffmanEncoder* __restrict__ k_enc,
                 const DeviceHuffmanEncoder* __restrict__ v_enc,
                 const HuffmanEncodeJob* __restrict__ jobs) {
  SLUICE_SHARED(enc, DeviceHuffmanEncoder[2]);
  SLUICE_SHARED(scan, BlockScan::TempStorage);
  SLUICE_SHARED(reduce, BlockReduce::TempStorage);
  SLUICE_SHARED(shared_total, uint32_t);
  const HuffmanEncodeJob job = jobs[blockIdx.x];
  const KvPageLayout& l = tier.layout;
  const KvPageLayout& ul = tier.unit_layout;
  for (int i = threadIdx.x; i < 256; i += kEncodeThreads) {
    enc[0].lengths[i] = k_enc->lengths[i];
    enc[0].codes[i] = k_enc->codes[i];
    enc[1].lengths[i] = v_enc->lengths[i];
    enc[1].codes[i] = v_enc->codes[i];
  }
  __syncthreads();
  const int u = l.unit_tokens;
  const int n = tier.format.head_dim * u;  // symbols of K (and of V) per unit
  const int64_t capacity = tier.format.page_bytes - l.bitstream;
  uint32_t* streams = reinterpret_cast<uint32_t*>(job.page + l.streams);
  uint8_t* bits = job.page + l.bitstream;
  uint32_t* words = reinterpret_cast<uint32_t*>(bits);
  uint32_t start_bits = job.first_unit == 0 ? 0 : streams[job.first_unit * kStreamsPerUnit];
  int64_t written = 0;
  for (int j = 0; j < job.units_count; ++j) {
    const int index = job.first_unit + j;
    if ((index + 1) * u > l.tokens) break;
    const uint8_t* unit = job.units + static_cast<int64_t>(j) * ul.bytes_used;
    const uint8_t* k = unit + ul.k_codes;
    const uint8_t* v = unit + ul.v_codes;
    const uint32_t kb = BlockBits(enc[0], k, n, reduce, &shared_total);
    const uint32_t vb = BlockBits(enc[1], v, n, reduce, &shared_total);
    const int64_t start = (start_bits + 7) / 8;
    const int64_t k_bytes = (kb + 7) / 8, v_bytes = (vb + 7) / 8;
    if (start + k_bytes + v_bytes + kPaddingBytes > capacity) break;
    // Zero the unit's bytes and the padding after them, then OR the codes in.
    const int64_t end = start + k_bytes + v_bytes + kPaddingBytes;
    for (int64_t i = start + threadIdx.x; i < end; i += kEncodeThreads) bits[i] = 0;
    __syncthreads();
    uint32_t* out = streams + static_cast<int64_t>(index) * kStreamsPerUnit;
    EncodeHalf(enc[0], k, n, static_cast<uint32_t>(start * 8), words, out, scan);
    const int64_t v_start = start + k_bytes;
    EncodeHalf(enc[1], v, n, static_cast<uint32_t>(v_start * 8), words, out + kKvHuffmanStreams,
               scan);
    start_bits = static_cast<uint32_t>(v_start * 8 + vb);
    // Unit meta, the end of the unit, token meta and valid bits.
    uint8_t* meta = job.page + l.unit_meta + static_cast<int64_t>(index) * l.unit_meta_bytes;
    for (int i = threadIdx.x; i < l.unit_meta_bytes; i += kEncodeThreads) {
      meta[i] =
          i < l.unit_k_meta_bytes ? unit[ul.k_meta + i] : unit[ul.v_meta + i - l.unit_k_meta_bytes];
    }
    const int64_t first = static_cast<int64_t>(index) * u;
    for (int t = threadIdx.x; t < u; t += kEncodeThreads) {
      if (tier.format.token_meta) {
        const int64_t at = written + t;
        reinterpret_cast<float*>(job.page + l.scores)[first + t] =
            job.scores ? job.scores[at] : 0.f;
        reinterpret_cast<int32_t*>(job.page + l.positions)[first + t] =
            job.positions ? job.positions[at] : -1;
      }
    }
    if (threadIdx.x == 0) {
      out[kStreamsPerUnit] = start_bits;
      const uint64_t mask = u == 64 ? ~uint64_t{0} : (uint64_t{1} << u) - 1;
      reinterpret_cast<uint64_t*>(job.page + l.valid)[first / 64] |= mask << (first % 64);
    }
    written += u;
    __syncthreads();
  }
  if (threadIdx.x == 0) *job.tokens_written = written;
}

// One block per job: its threads decode the unit's streams (huffman_unit.cuh), then copy the
// unit's meta and valid bits.
__global__ void __launch_bounds__(kHuffmanUnitThreads)
    DecodeKernel(const HuffmanTierDesc tier, const uint16_t* __restrict__ k_table, int32_t k_bits,
                 const uint16_t* __restrict__ v_table, int32_t v_bits,
                 const HuffmanDecodeJob* __restrict__ jobs) {
  const HuffmanDecodeJob job = jobs[blockIdx.x];
  const KvPageLayout& l = tier.layout;
  const KvPageLayout& ul = tier.unit_layout;
  DecodeHuffmanUnit(
      reinterpret_cast<const uint32_t*>(job.page + l.bitstream),
      reinterpret_cast<const uint32_t*>(job.page + l.streams) + job.unit * kStreamsPerUnit,
      tier.format.head_dim * l.unit_tokens / kKvHuffmanStreams, k_table, (1u << k_bits) - 1,
      v_table, (1u << v_bits) - 1, job.out + ul.k_codes, job.out + ul.v_codes);
  const uint8_t* meta = job.page + l.unit_meta + static_cast<int64_t>(job.unit) * l.unit_meta_bytes;
  for (int i = threadIdx.x; i < l.unit_meta_bytes; i += kHuffmanUnitThreads) {
    job.out[i < l.unit_k_meta_bytes ? ul.k_meta + i : ul.v_meta + i - l.unit_k_meta_bytes] =
        meta[i];
  }
  if (threadIdx.x == 0) {
    const int u = l.unit_tokens;
    const int64_t first = static_cast<int64_t>(job.unit) * u;
    const uint64_t word = reinterpret_cast<const uint64_t*>(job.page + l.valid)[first / 64];
    const uint64_t m = u == 64 ? ~uint64_t{0} : (uint64_t{1} << u) - 1;
    *reinterpret_cast<uint64_t*>(job.out + ul.valid) = (word >> (first % 64)) & m;
  }
}

}  // namespace

cudaError_t LaunchHuffmanEncode(const HuffmanTierDesc& tier, const DeviceHuffmanEncoder* k,
                                const DeviceHuffmanEncoder* v, const HuffmanEncodeJob* jobs,
                                int32_t job_count, cudaStream_t stream) {
  if (job_count <= 0) return cudaSuccess;
  SLUICE_LAUNCH(job_count, kEncodeThreads, 0, stream, EncodeKernel)(tier, k, v, jobs);
  return cudaGetLastError();
}

cudaError_t LaunchHuffmanDecode(const HuffmanTierDesc& tier, const uint16_t* k_table,
                                int32_t k_bits, const uint16_t* v_table, int32_t v_bits,
                                const HuffmanDecodeJob* jobs, int32_t job_count,
                                cudaStream_t stream) {
  if (job_count <= 0) return cudaSuccess;
  SLUICE_LAUNCH(static_cast<unsigned>(job_count), kHuffmanUnitThreads, 0, stream, DecodeKernel)
  (tier, k_table, k_bits, v_table, v_bits, jobs);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
