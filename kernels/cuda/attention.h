// CUDA causal grouped-query prefill attention in fp32 (AttentionParams), with the optional
// cumulative attention per key (key_scores) computed in two passes as in MiniKV §3.2:
//   pass 1: one warp per (query, head) streams K/V tiles through shared memory with an online
//           softmax, writes the output and, when key_scores is wanted, the row's maximum and
//           normalizer;
//   pass 2: one thread per key recomputes its dot products with the queries that see it and
//           adds sum_t exp(s_tj - m_t) / l_t to key_scores[h, j].
// Memory beyond the inputs is two floats per (query, head); no [queries, keys] matrix is built.
#ifndef SLUICE_KERNELS_CUDA_ATTENTION_H_
#define SLUICE_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/op_params.h"

namespace sluice::kernels::cuda {

// The head dims the kernels are compiled for: 8, 16, 32, 64, 80, 96, 128, 256.
bool AttentionSupportsHeadDim(int64_t head_dim);
inline constexpr const char* kAttentionHeadDims = "8, 16, 32, 64, 80, 96, 128, 256";

// Device workspace bytes LaunchAttention needs for `p`: the row maxima and normalizers
// ([2, q_tokens, heads] floats) when key_scores is set, else 0.
size_t AttentionWorkspaceBytes(const AttentionParams& p);

// Enqueues attention on `stream`. `p` is valid (Backend::Attention checked it) with device
// pointers, a supported head_dim, q_tokens * heads and kv_tokens below 2^31 and heads below
// 2^16; `workspace` holds AttentionWorkspaceBytes(p) bytes of device memory (may be null when
// that is 0). key_scores, when set, is added to, not overwritten. cudaErrorInvalidValue for an
// unsupported head_dim.
cudaError_t LaunchAttention(const AttentionParams& p, float* workspace, cudaStream_t stream);

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_ATTENTION_H_
