// The kernels behind kernels/cuda/decode_attention.h and the plain structs the host plan fills
// for them. Internal to the CUDA backend: no absl here, so nvcc compiles only what it must.
#ifndef SLUICE_KERNELS_CUDA_DECODE_ATTENTION_KERNELS_H_
#define SLUICE_KERNELS_CUDA_DECODE_ATTENTION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/kv_format.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

#ifdef __CUDACC__
#define SLUICE_HOST_DEVICE __host__ __device__
#else
#define SLUICE_HOST_DEVICE
#endif

inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeMaxTiers = 4;
// Recent (fp32) tokens handled per pass.
inline constexpr int kRecentView = 64;

// x / d for 0 <= x < 2^32 / d by one multiply-high (FastDivide in decode_attention_kernels.cu),
// where the divisor is known only at run time: nvcc's own sequence for a runtime `/` or `%` is
// about 15 instructions (I2F, MUFU.RCP, F2I, corrections).
struct FastDiv {
  uint32_t d = 1;
  uint32_t mul = 0;  // ceil(2^32 / d); unused for d == 1
};
inline FastDiv MakeFastDiv(uint32_t d) {
  return {d, d <= 1 ? 0u : static_cast<uint32_t>(((uint64_t{1} << 32) + d - 1) / d)};
}

// What the generic chunk kernel derives from a tier's (unit) format, made once on the host so
// its loops divide by nothing known only at run time.
struct DecodeTierConsts {
  // Keys.
  int32_t k_per_shift = 0;  // log2 of codes per byte (int)
  int32_t k_groups = 1;     // d / group (per token), channel groups
  int32_t k_blocks = 1;     // d / block channels (per channel: d; block: d / block_channels)
  int32_t k_group8 = 0;     // group / 8 when group % 8 == 0, else 0
  FastDiv k_tile;           // tokens per key tile
  FastDiv k_group;          // tokens (per channel, block) or channels (per token, fp8) per group
  FastDiv k_block;          // channels per meta block (1 per channel)
  int32_t k_meta_halves = 0;
  // Values.
  int32_t v_groups = 1;  // d / group
  int32_t v_per = 1;     // codes per byte (1 for f16 / fp8)
  int32_t v_cols = 0;    // thread items' columns: row bytes (int) or d
  int32_t v_splits = 1;  // token splits: max(1, threads / cols)
  FastDiv v_group;       // channels per group
  FastDiv v_cols_div;
  int32_t v_meta_halves = 0;
};

// One tier as the kernels see it. For a Huffman-coded tier, `unit_format`/`unit_layout` are the
// fixed-width unit page each unit decodes into; otherwise they equal `format`/`layout`.
struct DecodeTier {
  KvTierFormat format;
  KvPageLayout layout;
  KvTierFormat unit_format;
  KvPageLayout unit_layout;
  const uint16_t* k_table = nullptr;  // device [1 << k_table_bits], HuffmanCodebook::decode_table
  const uint16_t* v_table = nullptr;
  int32_t k_table_bits = 0;
  int32_t v_table_bits = 0;
  int32_t load_bytes = 0;  // bytes of each page copied to shared memory, a multiple of 16
  bool huffman = false;
  DecodeTierConsts consts;  // of unit_format / unit_layout
};

// A run of one (sequence, kv-head)'s pages, or (recent_begin >= 0) its recent tokens. For the
// KIVI kernel a chunk may hold both: its pages, then the recent tokens.
struct DecodeChunk {
  int32_t bh = 0;          // sequence * kv_heads + kv-head
  int32_t page_begin = 0;  // [page_begin, page_end) of DecodeKernelParams::pages
  int32_t page_end = 0;
  int32_t key_base = 0;  // key index (within the bh's keys) of page_begin's slot 0
  int32_t recent_begin = -1;
  int32_t recent_end = -1;
};

// The generic kernel's constants for a tier of (unit) format `f`, layout `l`, head_dim d.
DecodeTierConsts MakeDecodeTierConsts(const KvTierFormat& f, const KvPageLayout& l, int d);

// Halves of a meta segment (kernels/kv_format.h) of `spec` on a page of `tokens` slots.
SLUICE_HOST_DEVICE inline int KvMetaHalves(const KvQuantSpec& spec, int d, int tokens) {
  if (spec.codec == KvCodec::kF16) return 0;
  const int gs = spec.group == 0 ? d : spec.group;
  if (spec.codec == KvCodec::kFp8) return (d / gs) * tokens;
  if (spec.grouping == KvGrouping::kPerToken) return 2 * (d / gs) * tokens;
  const int blocks = spec.grouping == KvGrouping::kBlock ? d / spec.block_channels : d;
  return (tokens / gs) * 2 * blocks;
}

struct DecodeKernelParams {
  DecodeTier tiers[kDecodeMaxTiers];
  int32_t tier_count = 0;
  const KvPageRef* pages = nullptr;        // device [pages]
  const DecodeChunk* chunks = nullptr;     // device [chunk_count]
  const int32_t* chunk_offsets = nullptr;  // device [bh_count + 1]: bh's chunks, contiguous
  // Keys of each bh: its pages' slots (dead or alive), then its recent tokens.
  const int32_t* key_offsets = nullptr;     // device [bh_count + 1]
  const int32_t* slot_offsets = nullptr;    // device [bh_count + 1]: paged slots only
  const int64_t* recent_offsets = nullptr;  // device [batch + 1]: prefix sums of recent tokens
  // Device [batch]: sequence b's recent tokens [its recent tokens, kv_heads, head_dim].
  const float* const* recent_k = nullptr;
  const float* const* recent_v = nullptr;
  const float* q = nullptr;  // [batch, q_tokens, heads, head_dim]
  float* out = nullptr;      // [batch, q_tokens, heads, head_dim]
  int32_t chunk_count = 0;
  int32_t bh_count = 0;
  int32_t q_tokens = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t group = 0;  // heads / kv_heads
  int32_t rows = 0;   // group * q_tokens; row r is query token r / group, query head r % group
  FastDiv head_dim_div;
  FastDiv head_dim8_div;  // head_dim / 8
  FastDiv group_div;
  float scale = 1.f;
  // Workspace.
  float* part_m = nullptr;    // [chunk_count, rows]
  float* part_l = nullptr;    // [chunk_count, rows]
  float* part_acc = nullptr;  // [chunk_count, rows, head_dim]
  float* row_m = nullptr;     // [bh_count, rows]
  float* row_l = nullptr;     // [bh_count, rows]
  float* logits = nullptr;    // [key_offsets[bh_count], rows], or null without scores
  // Shared memory carve-up (bytes / floats), from the plan.
  int32_t page_buffer_bytes = 0;  // one of two page buffers
  int32_t unit_buffer_bytes = 0;
  int32_t meta_floats = 0;
  int32_t view_tokens = 0;
  // Scores: sequence b's as PagedAttentionParams' (rows of its paged slots, then of its recent
  // tokens), from page_scores + page_score_offsets[b] and recent_scores +
  // recent_score_offsets[b]; null offsets (one sequence) start both at 0.
  float* page_scores = nullptr;
  float* recent_scores = nullptr;
  const int64_t* page_score_offsets = nullptr;    // device [batch], or null
  const int64_t* recent_score_offsets = nullptr;  // device [batch], or null
  bool scores_per_head = false;
};

// Which chunk kernel runs a plan.
//  - generic: any tiers, formats read at run time; `rows_per_block` (1, 2, 4 or 8) query rows
//    per block;
//  - KIVI (kivi_bits 2 or 4): one fixed-width tier with int keys per channel over
//    kKiviKeyTokens-token groups and int values per token over kKiviValueChannels-channel
//    groups, both with kivi_bits bits, head_dim 128 (2 or 4 bits) or 64 (4 bits): the sluice,
//    kivi4, kivi2 and minikv presets; every size a compile-time constant, both products on the
//    tensor cores; kKiviRows query rows per block, and the recent tokens in the last chunk of
//    each (sequence, kv-head).
struct DecodeKernelChoice {
  int rows_per_block = 1;
  int kivi_bits = 0;
};
inline constexpr int kKiviRows = 4;
inline constexpr int kKiviKeyTokens = 32;
inline constexpr int kKiviValueChannels = 32;

// The KIVI kernel when `tier` (head_dim d) is its format, else the generic one for `rows`.
DecodeKernelChoice ChooseDecodeKernel(const DecodeTier* tiers, int tier_count, int d, int rows);

// Shared memory one block of the chosen kernel needs.
size_t DecodeSharedBytes(const DecodeKernelParams& p, DecodeKernelChoice k);
// How many blocks of the chosen chunk kernel fit on one SM at once (the CUDA occupancy
// calculator, for this shared memory and the kernel's registers).
cudaError_t DecodeBlocksPerSm(const DecodeKernelParams& p, DecodeKernelChoice k, int* blocks);

// Enqueues the chunk kernel and the merge on `stream`.
cudaError_t LaunchDecodeAttention(const DecodeKernelParams& p, DecodeKernelChoice k,
                                  cudaStream_t stream);
// Then, with logits: adds each key's weights to its sequence's page_scores / recent_scores.
// max_keys bounds any bh's keys.
cudaError_t LaunchDecodeScores(const DecodeKernelParams& p, int64_t max_keys, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_DECODE_ATTENTION_KERNELS_H_
