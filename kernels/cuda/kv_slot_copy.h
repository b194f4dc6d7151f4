// The sparse slot copy (SpvLLM): copies of token slots between the pages of one device arena,
// one warp per move, for compaction (kvstore/memory/cuda's GpuCompactor, and the CUDA backend's
// KvMoveSlots). Launch functions enqueue work on a stream and return the launch error. No absl
// here: nvcc compiles this header. Parameters must be valid; the callers check them.
#ifndef SLUICE_KERNELS_CUDA_KV_SLOT_COPY_H_
#define SLUICE_KERNELS_CUDA_KV_SLOT_COPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/kv_format.h"

namespace sluice::kernels::cuda {

// Where one slot's data lives in a page of a fixed-width tier (kernels/kv_format.h), in bytes
// from the page start.
struct SlotCopyLayout {
  int32_t tokens = 0;  // slots per page; the stride of planar per-token metadata
  int32_t group = 1;   // token group of K: moves are whole aligned groups
  int32_t valid = 0;   // u64 validity bitmap
  // K codes: k_tile 1: row of k_row_bytes at k_codes + slot * k_row_bytes. k_tile T > 1
  // (channel-major tiles): byte q < k_row_bytes of the slot's row at
  // k_codes + slot / T * T * k_row_bytes + q * T + slot % T.
  int32_t k_codes = 0;
  int32_t k_row_bytes = 0;
  int32_t k_tile = 1;
  // K metadata: per-token planes of fp16 (plane p of slot s at k_meta + 2 * (p * tokens + s)),
  // or, for K grouped along tokens, k_unit_meta_bytes per group at
  // k_meta + slot / group * k_unit_meta_bytes. Either count may be 0.
  int32_t k_meta = 0;
  int32_t k_meta_planes = 0;
  int32_t k_unit_meta_bytes = 0;
  // V codes (rows, token-major) and per-token fp16 planes.
  int32_t v_codes = 0;
  int32_t v_row_bytes = 0;
  int32_t v_meta = 0;
  int32_t v_meta_planes = 0;
  int32_t scores = -1;     // f32 per slot, -1: none
  int32_t positions = -1;  // i32 per slot, -1: none
};

// Copy `slots` consecutive slots of arena page src_page to dst_page.
struct DeviceSlotMove {
  int32_t src_page;
  int32_t src_slot;
  int32_t dst_page;
  int32_t dst_slot;
  int32_t slots;
  int32_t src_used;  // source slots at or past this count as not valid
};

struct SparseCopyParams {
  uint8_t* arena;  // [num_pages * page_bytes]
  int64_t page_bytes;
  SlotCopyLayout layout;
  // [num_moves]; no slot is written by one move and read or written by another.
  const DeviceSlotMove* moves;
  int64_t num_moves;
  // Each destination slot's valid bit becomes its source's (clear at or past src_used); with
  // clear_source the source's bit is cleared as well (compaction).
  bool clear_source;
};

// Copies every move's slot data (codes, metadata, score, position) and validity bits; one warp
// per move.
cudaError_t LaunchSparseCopy(const SparseCopyParams& p, cudaStream_t stream);

// The copy layout of pages of `format` laid out as `layout` (ComputePageLayout(format)); a
// fixed-width format.
SlotCopyLayout SlotCopyLayoutOf(const KvTierFormat& format, const KvPageLayout& layout);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_KV_SLOT_COPY_H_
