#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/get_rows.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/kv_huffman.h"

namespace sluice::kernels {

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const CpuOptions& options) {
  const cpu::Isa isa = options.isa.value_or(cpu::BestIsa());
  if (!cpu::IsaSupported(isa)) {
    return absl::UnavailableError(absl::StrFormat("this CPU does not support %s (best: %s)",
                                                  cpu::IsaName(isa), cpu::IsaName(cpu::BestIsa())));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("threads=%d < 0", options.threads));
  }
  const int threads = options.threads > 0 ? options.threads : omp_get_num_procs();
  return std::unique_ptr<CpuBackend>(new CpuBackend(isa, threads));
}

std::string CpuBackend::name() const {
  return absl::StrFormat("cpu (%s, %d threads)", cpu::IsaName(isa_), threads_);
}

bool CpuBackend::Supports(Op) const { return true; }

absl::Status CpuBackend::DoRmsNorm(const RmsNormParams& p) {
  cpu::RmsNorm(p, isa_, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoMatmul(const MatmulParams& p) {
  cpu::Matmul(p, isa_, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoGetRows(const GetRowsParams& p) {
  cpu::GetRows(p, isa_, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoRope(const RopeParams& p) {
  cpu::Rope(p, isa_, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoSwiGlu(const SwiGluParams& p) {
  cpu::SwiGlu(p, isa_, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoSoftmax(const SoftmaxParams& p) {
  cpu::Softmax(p, isa_, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoAttention(const AttentionParams& p) {
  cpu::Attention(p, isa_, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoKvQuantize(const KvQuantizeParams& p) {
  if (p.format.huffman_bits > 0) {
    return KvQuantizeHuffman(p, [&](const KvQuantizeParams& unit) { cpu::KvQuantize(unit, isa_); });
  }
  cpu::KvQuantize(p, isa_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoKvQuantizeBatch(absl::Span<const KvQuantizeParams> items) {
  // Every item on the threads (items write distinct pages); a coded item (which fills its page
  // unit by unit) may fail, and the first failure in item order is the batch's.
  const int64_t n = static_cast<int64_t>(items.size());
  std::vector<absl::Status> status(n);
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1) if (threads_ > 1 && n > 1)
  for (int64_t i = 0; i < n; ++i) {
    if (items[i].format.huffman_bits > 0) {
      status[i] = DoKvQuantize(items[i]);
    } else if (items[i].tokens > 0) {
      cpu::KvQuantize(items[i], isa_);
    }
  }
  for (absl::Status& st : status) SLUICE_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoKvDequantize(const KvDequantizeParams& p) {
  if (p.format.huffman_bits > 0) {
    return KvDequantizeHuffman(p, /*reference=*/false, [&](const KvDequantizeParams& unit) {
      cpu::KvDequantize(unit, isa_);
    });
  }
  cpu::KvDequantize(p, isa_);
  return absl::OkStatus();
}

namespace {

// The fused CPU kernel keeps a kv-head's query heads in registers: up to kPagedAttentionMaxGroup.
absl::Status CheckGroup(int64_t heads, int64_t kv_heads) {
  if (heads / kv_heads <= cpu::kPagedAttentionMaxGroup) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("paged_attention: ", heads / kv_heads,
                                               " query heads per kv-head; the CPU "
                                               "kernel handles up to ",
                                               cpu::kPagedAttentionMaxGroup));
}

}  // namespace

absl::Status CpuBackend::DoPagedAttention(const PagedAttentionParams& p) {
  SLUICE_RETURN_IF_ERROR(CheckGroup(p.heads, p.kv_heads));
  cpu::PagedAttention(p, isa_, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoBatchPagedAttention(const BatchPagedAttentionParams& p,
                                               absl::Span<const PagedAttentionParams> sequences) {
  SLUICE_RETURN_IF_ERROR(CheckGroup(p.heads, p.kv_heads));
  cpu::PagedAttention(sequences, isa_, threads_);
  return absl::OkStatus();
}

}  // namespace sluice::kernels
