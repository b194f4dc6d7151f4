#include "kernels/ref/ref_backend.h"

#include "kernels/kv_huffman.h"
#include "kernels/ref/attention.h"
#include "kernels/ref/get_rows.h"
#include "kernels/ref/kv_quant.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/paged_attention.h"
#include "kernels/ref/rmsnorm.h"
#include "kernels/ref/rope.h"
#include "kernels/ref/softmax.h"
#include "kernels/ref/swiglu.h"

namespace sluice::kernels {

bool RefBackend::Supports(Op) const { return true; }

absl::Status RefBackend::DoRmsNorm(const RmsNormParams& p) {
  ref::RmsNorm(p);
  return absl::OkStatus();
}

absl::Status RefBackend::DoMatmul(const MatmulParams& p) {
  ref::Matmul(p);
  return absl::OkStatus();
}

absl::Status RefBackend::DoGetRows(const GetRowsParams& p) {
  ref::GetRows(p);
  return absl::OkStatus();
}

absl::Status RefBackend::DoRope(const RopeParams& p) {
  ref::Rope(p);
  return absl::OkStatus();
}

absl::Status RefBackend::DoSwiGlu(const SwiGluParams& p) {
  ref::SwiGlu(p);
  return absl::OkStatus();
}

absl::Status RefBackend::DoSoftmax(const SoftmaxParams& p) {
  ref::Softmax(p);
  return absl::OkStatus();
}

absl::Status RefBackend::DoAttention(const AttentionParams& p) {
  ref::Attention(p);
  return absl::OkStatus();
}

absl::Status RefBackend::DoKvQuantize(const KvQuantizeParams& p) {
  if (p.format.huffman_bits > 0) {
    return KvQuantizeHuffman(p, [](const KvQuantizeParams& unit) { ref::KvQuantize(unit); });
  }
  ref::KvQuantize(p);
  return absl::OkStatus();
}

absl::Status RefBackend::DoKvDequantize(const KvDequantizeParams& p) {
  return ref::KvDequantizeAny(p);
}

absl::Status RefBackend::DoPagedAttention(const PagedAttentionParams& p) {
  return ref::PagedAttention(p);
}

}  // namespace sluice::kernels
