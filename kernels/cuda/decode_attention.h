// CUDA attention over compressed, mixed-tier KV pages with the decoding fused in: pages are
// copied into shared memory (double-buffered, 16-byte cp.async) and decoded there, and no fp32
// copy of the KV ever reaches device memory. KIVI pages (one tier: int keys per channel, int
// values per token, the sluice, kivi4, kivi2 and minikv presets) go to a kernel specialised at
// compile time that runs both products on the tensor cores; every other format to a generic
// kernel (Huffman units decoded in shared memory, codes expanded in registers). See
// decode_attention_kernels.h and bench/gpu/NOTES.md.
//
// Split-K ("flash decoding"): the host plan cuts each (sequence, kv-head) page list into chunks
// of pages of near-equal size; the full-precision recent tokens go in the last of them (KIVI
// kernel) or in a chunk of their own (generic kernel). One thread block runs a chunk for up to
// 8 query rows (a kv-head's query heads x query tokens) and writes a partial softmax state; a
// second kernel merges the chunks of each (sequence, kv-head).
//
//   SLUICE_ASSIGN_OR_RETURN(DecodeAttentionPlan plan, DecodeAttentionPlan::Create(batch_desc));
//   SLUICE_RETURN_IF_ERROR(plan.Run(q, out, stream));   // as often as the pages stay the same
//
// A decode loop builds one plan per step over a DecodeAttentionWorkspace, for all the step's
// layers (DecodeBatch::layers; DecodeStepPlan is the Backend's side of it), and runs it once
// per layer: the plan's arrays live in the workspace's device memory, its metadata goes over in
// one asynchronous copy from the workspace's pinned staging, and once the workspace has grown to
// the largest step nothing is allocated and nothing waits for the stream between layers.
#ifndef SLUICE_KERNELS_CUDA_DECODE_ATTENTION_H_
#define SLUICE_KERNELS_CUDA_DECODE_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// At most this many tiers in one plan.
inline constexpr int kMaxDecodeTiers = 4;

// A batch of sequences over one or more layers (a decode step planned once, run layer by
// layer), all metadata in host memory; page data and the recent K/V in device memory. Layer l,
// sequence b, kv-head h owns pages [page_offsets[i], page_offsets[i + 1]) for the list
// i = (l * batch + b) * kv_heads + h.
struct DecodeBatch {
  int64_t layers = 1;
  int64_t batch = 0;
  int64_t q_tokens = 0;  // queries per sequence (1 for decode)
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.f;
  const KvTierFormat* formats = nullptr;  // [tier_count]
  const KvPageLayout* layouts = nullptr;  // [tier_count]
  // [layers * tier_count], layer-major; Huffman-coded tiers only (each layer its codebooks).
  const KvCodebooks* codebooks = nullptr;
  int32_t tier_count = 0;
  const KvPageRef* pages = nullptr;       // [page_offsets[lists]]; data on device
  const int32_t* page_offsets = nullptr;  // [layers * batch * kv_heads + 1]
  // Recent (full-precision) tokens of sequence b: recent_offsets[b + 1] - recent_offsets[b] of
  // them (at least q_tokens, the same in every layer), rows [kv_heads, head_dim] from
  // recent_k[l * batch + b] / recent_v[...] in layer l (each sequence and layer keeps its own
  // window; a packed array passes pointers into itself).
  const int64_t* recent_offsets = nullptr;  // [batch + 1]
  const float* const* recent_k = nullptr;   // [layers * batch], device pointers
  const float* const* recent_v = nullptr;   // [layers * batch], device pointers
  // Pages per chunk; 0 lets the plan choose (ChoosePagesPerChunk).
  int32_t pages_per_chunk = 0;
  // For key scores at any batch: where each (layer, sequence)'s scores start in Run's
  // page_scores and recent_scores ([layers * batch] each, host). A plan of one sequence and one
  // layer takes scores without them (both start at 0).
  const int64_t* page_score_offsets = nullptr;
  const int64_t* recent_score_offsets = nullptr;
};

// Device and pinned host memory that plans are built in, grown to the largest plan and kept.
// Use it from one stream: a plan built over it is valid until the next Create over it.
class DecodeAttentionWorkspace {
 public:
  DecodeAttentionWorkspace();
  DecodeAttentionWorkspace(DecodeAttentionWorkspace&&) noexcept;
  DecodeAttentionWorkspace& operator=(DecodeAttentionWorkspace&&) noexcept;
  ~DecodeAttentionWorkspace();

  // Bytes of device memory held.
  int64_t device_bytes() const;

 private:
  friend class DecodeAttentionPlan;
  struct State;
  std::unique_ptr<State> state_;
};

// Device copies of a batch's page table, work split and workspace. Move-only. Without a
// workspace it owns its device memory (freed when destroyed) and Create waits for its copies.
// Build once per step (or once for a benchmark), run many times.
class DecodeAttentionPlan {
 public:
  // InvalidArgument for shapes the kernels do not take (head_dim not a multiple of 32 or over
  // 256, a page not 16-byte aligned, more than kMaxDecodeTiers tiers); errors of the CUDA calls.
  static absl::StatusOr<DecodeAttentionPlan> Create(const DecodeBatch& batch, cudaStream_t stream,
                                                    DecodeAttentionWorkspace* workspace = nullptr);
  DecodeAttentionPlan(DecodeAttentionPlan&&) noexcept;
  DecodeAttentionPlan& operator=(DecodeAttentionPlan&&) noexcept;
  ~DecodeAttentionPlan();

  // out[b, t, h, :] for q [batch, q_tokens, heads, head_dim] (both device, fp32), over layer
  // `layer`'s pages. With scores (a plan of one sequence and layer, or one made with score
  // offsets), each sequence's page_scores / recent_scores as in PagedAttentionParams, from its
  // offsets; device memory.
  absl::Status Run(const float* q, float* out, cudaStream_t stream, float* page_scores = nullptr,
                   float* recent_scores = nullptr, bool scores_per_head = false,
                   int64_t layer = 0) const;

  int64_t layers() const;

  int64_t chunks() const;  // of layer 0
  // The chunk kernel it runs: "kivi4" or "kivi2" (kernels/cuda/decode_attention_kernels.h), or
  // "generic".
  std::string kernel() const;
  // Bytes of page data the kernels read over all layers' Runs (whole pages as loaded).
  int64_t page_bytes_read() const;

 private:
  struct State;
  explicit DecodeAttentionPlan(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The pages per chunk a plan picks when DecodeBatch::pages_per_chunk is 0. Blocks run in waves
// of `wave` (SMs x blocks per SM) and a layer's launch lasts about its waves times its longest
// chunk plus a chunk's fixed work (query load, partial state, its share of the merge), counted
// as kChunkFixedPages pages; a chunk of recent tokens only costs its fixed work. Of the sizes
// that cut the longest list into 1 to 16 more than twice the pieces that make a layer one wave,
// and a wave's share of the pages, the one whose launches sum to the least; ties go to the
// larger size (fewer partial states). `page_offsets`: [layers * lists_per_layer + 1];
// `row_groups`: blocks per chunk (query rows over rows per block); `recent_chunk`: whether each
// list also gets a chunk of its own for its recent tokens (the generic kernel) rather than
// folding them into its last chunk.
inline constexpr int64_t kChunkFixedPages = 2;
int64_t ChoosePagesPerChunk(absl::Span<const int32_t> page_offsets, int64_t layers,
                            int64_t row_groups, int64_t wave, bool recent_chunk);

// Backend::PagedAttention on the GPU: one sequence, host metadata, device data. With a
// workspace, the plan is built in it and the call returns without waiting for the kernels.
absl::Status PagedAttention(const PagedAttentionParams& p, cudaStream_t stream,
                            DecodeAttentionWorkspace* workspace = nullptr);

// Whether a batch runs as one plan: every sequence has the same number of queries (a decode
// step's one), and key scores, if asked for, come with each sequence's score offsets. `sequences`
// are the batch's sequences as Backend::BatchPagedAttention resolved them.
bool RunsAsOnePlan(const BatchPagedAttentionParams& p,
                   absl::Span<const PagedAttentionParams> sequences);
// Backend::BatchPagedAttention on the GPU for a batch that RunsAsOnePlan: one plan, one launch.
absl::Status BatchPagedAttention(const BatchPagedAttentionParams& p,
                                 absl::Span<const PagedAttentionParams> sequences,
                                 cudaStream_t stream, DecodeAttentionWorkspace* workspace);

// Backend::PlanBatchPagedAttention on the GPU: one DecodeAttentionPlan over every layer of the
// step (one upload of all the layers' page tables and work split), and host copies of what each
// layer's call must match (pages, windows, queries, and with key scores where each
// sequence's go). Null when a layer does not run as one plan (RunsAsOnePlan), or the step asks
// for key scores without saying where each (layer, sequence)'s go.
class DecodeStepPlan final : public BatchAttentionPlan {
 public:
  // `backend`: the Backend that owns `stream` and `workspace` (BatchAttentionPlan::backend).
  static absl::StatusOr<std::unique_ptr<BatchAttentionPlan>> Create(
      const void* backend, const BatchPagedAttentionStep& step,
      absl::Span<const std::vector<PagedAttentionParams>> layers, cudaStream_t stream,
      DecodeAttentionWorkspace* workspace);

  // Layer p.layer of the step: InvalidArgument unless `sequences` (p resolved) are exactly
  // that layer's (pages, windows, queries).
  absl::Status Run(const BatchPagedAttentionParams& p,
                   absl::Span<const PagedAttentionParams> sequences, cudaStream_t stream) const;

 private:
  DecodeStepPlan(const void* backend, DecodeAttentionPlan plan)
      : BatchAttentionPlan(backend), plan_(std::move(plan)) {}

  DecodeAttentionPlan plan_;
  int64_t batch_ = 0, kv_heads_ = 0, q_tokens_ = 0;
  std::vector<KvPageRef> pages_;
  std::vector<int32_t> page_offsets_;  // [layers * batch * kv_heads + 1]
  std::vector<int64_t> recent_offsets_;
  std::vector<const float*> recent_k_, recent_v_;  // [layers * batch]
  // With scores: each (layer, sequence)'s, as planned ([layers * batch]).
  std::vector<int64_t> page_score_offsets_, recent_score_offsets_;
};

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_DECODE_ATTENTION_H_
