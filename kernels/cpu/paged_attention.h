// Attention over compressed KV pages on the CPU, and the CPU dequantizer of pages.
//
// Decode (a few queries): each (kv-head, run of pages) task decodes page rows into an L1
// buffer and folds them into an online softmax; partials merge with the full-precision recent
// tokens. Longer query runs (prefill continuing after compressed tokens) gather the live tokens
// into fp32 once and use the dense SGEMM attention.
#ifndef SLUICE_KERNELS_CPU_PAGED_ATTENTION_H_
#define SLUICE_KERNELS_CPU_PAGED_ATTENTION_H_

#include "absl/types/span.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/op_params.h"

namespace sluice::kernels::cpu {

// Query heads per kv-head the fused kernel handles.
inline constexpr int64_t kPagedAttentionMaxGroup = 16;

// Parameters must be valid and heads / kv_heads <= kPagedAttentionMaxGroup.
void PagedAttention(const PagedAttentionParams& p, Isa isa, int threads);
// The sequences of a decode step at once: their tasks share one pool of threads, so a batch
// of short sequences keeps every thread busy. Each sequence's results are those of its own
// call.
void PagedAttention(absl::Span<const PagedAttentionParams> batch, Isa isa, int threads);
void KvDequantize(const KvDequantizeParams& p, Isa isa);

}  // namespace sluice::kernels::cpu

#endif  // SLUICE_KERNELS_CPU_PAGED_ATTENTION_H_
