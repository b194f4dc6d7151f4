// Block-parallel decoding of one unit of a Huffman-coded KV page (layout in kernels/kv_format.h):
// the unit's 2 * kKvHuffmanStreams streams (K then V) by kHuffmanUnitThreads threads, 16 lanes
// per stream, so every thread of a 128-thread block decodes. One definition for the decode
// attention kernel and the standalone decode kernel (kv_huffman.cu).
//
// A stream is a run of bits [b0, b1) holding n codes (and up to 7 bits of padding at its end).
// Lane i of a stream's 16 owns the codes that start in the i-th sixteenth of the bits. Only lane
// 0 knows where its first code starts; the others start at their sixteenth's first bit, which
// is usually inside a code. Canonical Huffman codes synchronize after a few codes when decoded
// from a wrong bit, so:
//   1. every lane scans its sixteenth from its guessed start, to the first code boundary past
//      its end;
//   2. each lane takes the previous lane's end as its start and rescans when that changed,
//      until no start changes (a warp vote). Lane 0's start is right, so after round r lanes
//      0..r are right: at most 16 rounds, usually one;
//   3. an exclusive scan of the lanes' code counts places each lane's codes, and each lane
//      decodes them into the unit's codes (the first n; padding decodes past them and is
//      dropped).
// Every step is a table lookup and an add per code, as in a one-thread-per-stream decoder; the
// chain of dependent lookups per stream is a sixteenth as long (three passes of n / 16 codes
// instead of one of n).
#ifndef SLUICE_KERNELS_CUDA_HUFFMAN_UNIT_CUH_
#define SLUICE_KERNELS_CUDA_HUFFMAN_UNIT_CUH_

#include <cstdint>

#include "kernels/kv_format.h"

namespace sluice::kernels::cuda {

// Threads that decode a unit together, and lanes per stream (a stream's lanes share a warp).
inline constexpr int kHuffmanUnitThreads = 128;
inline constexpr int kHuffmanStreamLanes = kHuffmanUnitThreads / (2 * kKvHuffmanStreams);
static_assert(kHuffmanStreamLanes == 16, "two streams per warp");

// 32 bits of a bitstream starting at bit `pos` (the stream's words 4-byte aligned).
__device__ __forceinline__ uint32_t HuffmanBitWindow(const uint32_t* words, uint32_t pos) {
  return __funnelshift_r(words[pos >> 5], words[(pos >> 5) + 1], pos & 31);
}

// The codes that start in [pos, end), from a guessed start: returns the first code boundary at
// or past `end` and their count in *count. A bit pattern no code starts with (a table entry of
// length 0, only in incomplete codes) counts as one bit, so a wrong start (or a corrupt page)
// cannot stall a decoder.
__device__ __forceinline__ uint32_t HuffmanScan(const uint32_t* words, const uint16_t* table,
                                                uint32_t mask, uint32_t pos, uint32_t end,
                                                int* count) {
  int c = 0;
  for (; pos < end; ++c) {
    pos +=
        max(static_cast<uint32_t>(__ldg(table + (HuffmanBitWindow(words, pos) & mask))) >> 8, 1u);
  }
  *count = c;
  return pos;
}

// Decodes the codes of unit `unit_streams` (its 2 * kKvHuffmanStreams + 1 stream offsets, in
// bits from `words`) into k_codes and v_codes ([kKvHuffmanStreams][n] each, stream-major), n
// codes per stream. Called by all kHuffmanUnitThreads threads of the block, thread t being
// threadIdx.x; uses no shared memory of its own and no block barrier (the caller syncs before
// reading the codes).
__device__ __forceinline__ void DecodeHuffmanUnit(const uint32_t* words,
                                                  const uint32_t* unit_streams, int n,
                                                  const uint16_t* k_table, uint32_t k_mask,
                                                  const uint16_t* v_table, uint32_t v_mask,
                                                  uint8_t* k_codes, uint8_t* v_codes) {
  constexpr int kLanes = kHuffmanStreamLanes;
  const int st = static_cast<int>(threadIdx.x) / kLanes;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const bool key = st < kKvHuffmanStreams;
  const uint16_t* table = key ? k_table : v_table;
  const uint32_t mask = key ? k_mask : v_mask;
  uint8_t* out = key ? k_codes + st * n : v_codes + (st - kKvHuffmanStreams) * n;
  const uint32_t b0 = unit_streams[st], span = unit_streams[st + 1] - b0;
  const uint32_t part = (span + kLanes - 1) / kLanes;
  const uint32_t lo = b0 + min(lane * part, span), hi = b0 + min((lane + 1) * part, span);

  uint32_t start = lo;
  int count = 0;
  uint32_t end = HuffmanScan(words, table, mask, start, hi, &count);
  for (int round = 0; round < kLanes; ++round) {
    const uint32_t prev = __shfl_up_sync(0xffffffffu, end, 1, kLanes);
    const uint32_t want = lane == 0 ? lo : prev;
    if (__all_sync(0xffffffffu, want == start)) break;
    if (want != start) {
      start = want;
      end = HuffmanScan(words, table, mask, start, hi, &count);
    }
  }
  // Exclusive scan of the counts over the stream's lanes.
  int first = count;
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, first, o, kLanes);
    if (lane >= o) first += x;
  }
  first -= count;
  uint32_t pos = start;
  for (int i = first; pos < hi; ++i) {
    const uint32_t e = __ldg(table + (HuffmanBitWindow(words, pos) & mask));
    if (i < n) out[i] = static_cast<uint8_t>(e & 0xff);
    pos += max(e >> 8, 1u);
  }
}

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_HUFFMAN_UNIT_CUH_
