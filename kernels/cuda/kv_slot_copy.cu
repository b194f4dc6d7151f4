#include <algorithm>
#include <cstdint>

#include "kernels/cuda/kv_slot_copy.h"
#include "kernels/cuda/launch.cuh"

namespace sluice::kernels::cuda {
namespace {

using u64 = unsigned long long;  // the type CUDA's 64-bit atomics take

constexpr int kWarp = 32;
constexpr int kCopyWarps = 8;  // one warp per move: a slot's rows are tens of words
constexpr int kCopyThreads = kCopyWarps * kWarp;
constexpr int64_t kMaxCopyBlocks = 1 << 20;

// ---- the sparse copy: one warp per move -----------------------------------------------------

// Copies `slots` rows of `row_bytes` (a multiple of 4, rows 4-byte aligned) from row src_slot of
// the segment at src to row dst_slot of the segment at dst; the lanes of a warp share the work.
__device__ void CopyRows(int lane, const uint8_t* src, int64_t src_slot, uint8_t* dst,
                         int64_t dst_slot, int32_t slots, int32_t row_bytes) {
  const int32_t words = row_bytes / 4;
  const uint32_t* from = reinterpret_cast<const uint32_t*>(src + src_slot * row_bytes);
  uint32_t* to = reinterpret_cast<uint32_t*>(dst + dst_slot * row_bytes);
  for (int64_t x = lane; x < int64_t{slots} * words; x += kWarp) to[x] = from[x];
}

// Copies `planes` planes of per-token fp16 metadata (plane p of slot s at p * tokens + s).
__device__ void CopyPlanes(int lane, const uint8_t* src, int64_t src_slot, uint8_t* dst,
                           int64_t dst_slot, int32_t slots, int32_t planes, int32_t tokens) {
  const uint16_t* from = reinterpret_cast<const uint16_t*>(src);
  uint16_t* to = reinterpret_cast<uint16_t*>(dst);
  for (int64_t x = lane; x < int64_t{slots} * planes; x += kWarp) {
    const int64_t k = x / planes;
    const int64_t p = x % planes;
    to[p * tokens + dst_slot + k] = from[p * tokens + src_slot + k];
  }
}

// Slots and bytes of a page are far below 2^31: 32-bit divisions (a 64-bit one is a call with a
// stack frame).
__device__ __forceinline__ int64_t TiledByte(const SlotCopyLayout& l, int32_t slot, int32_t q) {
  const int32_t tile = slot / l.k_tile;
  return (int64_t{tile} * l.k_tile) * l.k_row_bytes + int64_t{q} * l.k_tile +
         (slot - tile * l.k_tile);
}

__global__ void __launch_bounds__(kCopyThreads) SparseCopyKernel(SparseCopyParams p) {
  const SlotCopyLayout& l = p.layout;
  const int lane = threadIdx.x % kWarp;
  const int64_t first_warp = static_cast<int64_t>(blockIdx.x) * kCopyWarps + threadIdx.x / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kCopyWarps;
  // The warps of a block take different moves and never synchronize.
  for (int64_t m = first_warp; m < p.num_moves; m += warps) {
    const DeviceSlotMove mv = p.moves[m];
    const uint8_t* src = p.arena + int64_t{mv.src_page} * p.page_bytes;
    uint8_t* dst = p.arena + int64_t{mv.dst_page} * p.page_bytes;
    // K codes. In channel-major tiles, a slot's row is k_row_bytes bytes k_tile apart, each
    // holding codes of that slot only, so whole bytes move.
    if (l.k_tile == 1) {
      CopyRows(lane, src + l.k_codes, mv.src_slot, dst + l.k_codes, mv.dst_slot, mv.slots,
               l.k_row_bytes);
    } else {
      for (int32_t x = lane; x < mv.slots * l.k_row_bytes; x += kWarp) {
        const int32_t k = x / l.k_row_bytes;
        const int32_t q = x - k * l.k_row_bytes;
        dst[l.k_codes + TiledByte(l, mv.dst_slot + k, q)] =
            src[l.k_codes + TiledByte(l, mv.src_slot + k, q)];
      }
    }
    if (l.k_meta_planes > 0) {
      CopyPlanes(lane, src + l.k_meta, mv.src_slot, dst + l.k_meta, mv.dst_slot, mv.slots,
                 l.k_meta_planes, l.tokens);
    }
    if (l.k_unit_meta_bytes > 0) {  // whole groups: slots and both slot numbers are aligned
      const int64_t bytes = int64_t{mv.slots / l.group} * l.k_unit_meta_bytes;
      const uint8_t* from = src + l.k_meta + int64_t{mv.src_slot / l.group} * l.k_unit_meta_bytes;
      uint8_t* to = dst + l.k_meta + int64_t{mv.dst_slot / l.group} * l.k_unit_meta_bytes;
      for (int64_t x = lane; x < bytes; x += kWarp) to[x] = from[x];
    }
    CopyRows(lane, src + l.v_codes, mv.src_slot, dst + l.v_codes, mv.dst_slot, mv.slots,
             l.v_row_bytes);
    if (l.v_meta_planes > 0) {
      CopyPlanes(lane, src + l.v_meta, mv.src_slot, dst + l.v_meta, mv.dst_slot, mv.slots,
                 l.v_meta_planes, l.tokens);
    }
    if (l.scores >= 0) {
      CopyRows(lane, src + l.scores, mv.src_slot, dst + l.scores, mv.dst_slot, mv.slots, 4);
    }
    if (l.positions >= 0) {
      CopyRows(lane, src + l.positions, mv.src_slot, dst + l.positions, mv.dst_slot, mv.slots, 4);
    }
    // Validity bits. Other warps change other bits of the same words: atomics.
    for (int64_t k = lane; k < mv.slots; k += kWarp) {
      const int64_t s = mv.src_slot + k;
      const int64_t t = mv.dst_slot + k;
      u64* src_word = reinterpret_cast<u64*>(const_cast<uint8_t*>(src) + l.valid) + (s >> 6);
      u64* dst_word = reinterpret_cast<u64*>(dst + l.valid) + (t >> 6);
      const u64 src_bit = 1ull << (s & 63);
      const u64 old = p.clear_source ? atomicAnd(src_word, ~src_bit) : atomicOr(src_word, 0ull);
      const bool valid = s < mv.src_used && (old & src_bit) != 0;
      const u64 dst_bit = 1ull << (t & 63);
      if (valid) {
        atomicOr(dst_word, dst_bit);
      } else {
        atomicAnd(dst_word, ~dst_bit);
      }
    }
  }
}

// fp16 planes of per-token metadata of `spec` (kernels/kv_format.h: scales [groups][tokens],
// then zeros for int codes); 0 for f16 and for specs grouped along tokens.
int32_t PerTokenMetaPlanes(const KvQuantSpec& spec, int32_t head_dim) {
  if (spec.codec == KvCodec::kF16 || spec.grouping != KvGrouping::kPerToken) return 0;
  return head_dim / KvGroupOf(spec, head_dim) * (spec.codec == KvCodec::kInt ? 2 : 1);
}

}  // namespace

SlotCopyLayout SlotCopyLayoutOf(const KvTierFormat& f, const KvPageLayout& l) {
  SlotCopyLayout c;
  c.tokens = l.tokens;
  c.group = l.token_group;
  c.valid = l.valid;
  c.k_codes = l.k_codes;
  c.k_row_bytes = l.k_row_bytes;
  c.k_tile = l.k_tile;
  c.k_meta = l.k_meta;
  c.k_meta_planes = PerTokenMetaPlanes(f.k, f.head_dim);
  if (f.k.codec == KvCodec::kInt && f.k.grouping != KvGrouping::kPerToken) {
    // One (scale, zero) fp16 pair per channel, or per block of channels, per token group.
    const int32_t blocks =
        f.k.grouping == KvGrouping::kBlock ? f.head_dim / f.k.block_channels : f.head_dim;
    c.k_unit_meta_bytes = blocks * 4;
  }
  c.v_codes = l.v_codes;
  c.v_row_bytes = l.v_row_bytes;
  c.v_meta = l.v_meta;
  c.v_meta_planes = PerTokenMetaPlanes(f.v, f.head_dim);
  c.scores = l.scores;
  c.positions = l.positions;
  return c;
}

cudaError_t LaunchSparseCopy(const SparseCopyParams& p, cudaStream_t stream) {
  if (p.num_moves <= 0) return cudaSuccess;
  const int64_t blocks =
      std::min<int64_t>((p.num_moves + kCopyWarps - 1) / kCopyWarps, kMaxCopyBlocks);
  SLUICE_LAUNCH(static_cast<unsigned>(blocks), kCopyThreads, 0, stream, SparseCopyKernel)(p);
  return cudaGetLastError();
}

}  // namespace sluice::kernels::cuda
