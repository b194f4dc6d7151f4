// The CPU backend: vectorized kernels chosen at run time (AVX-512, AVX2 or scalar), threaded
// with OpenMP, in host memory.
#ifndef SLUICE_KERNELS_CPU_CPU_BACKEND_H_
#define SLUICE_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>
#include <optional>
#include <string>

#include "kernels/cpu/cpu_features.h"
#include "kernels/host_backend.h"

namespace sluice::kernels {

struct CpuOptions {
  // Instruction set to use; empty means the best this CPU supports.
  std::optional<cpu::Isa> isa;
  // Worker threads for large ops; 0 means one per available core.
  int threads = 0;
};

class CpuBackend final : public HostBackend {
 public:
  // Fails with UnavailableError if `options.isa` is not supported by this CPU.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const CpuOptions& options = {});

  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string name() const override;
  bool Supports(Op op) const override;

  cpu::Isa isa() const { return isa_; }
  int threads() const { return threads_; }

 protected:
  absl::Status DoRmsNorm(const RmsNormParams& p) override;
  absl::Status DoMatmul(const MatmulParams& p) override;
  absl::Status DoGetRows(const GetRowsParams& p) override;
  absl::Status DoRope(const RopeParams& p) override;
  absl::Status DoSwiGlu(const SwiGluParams& p) override;
  absl::Status DoSoftmax(const SoftmaxParams& p) override;
  absl::Status DoAttention(const AttentionParams& p) override;
  absl::Status DoKvQuantize(const KvQuantizeParams& p) override;
  absl::Status DoKvQuantizeBatch(absl::Span<const KvQuantizeParams> items) override;
  absl::Status DoKvDequantize(const KvDequantizeParams& p) override;
  absl::Status DoPagedAttention(const PagedAttentionParams& p) override;
  absl::Status DoBatchPagedAttention(const BatchPagedAttentionParams& p,
                                     absl::Span<const PagedAttentionParams> sequences) override;

 private:
  CpuBackend(cpu::Isa isa, int threads) : isa_(isa), threads_(threads) {}

  const cpu::Isa isa_;
  const int threads_;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_CPU_CPU_BACKEND_H_
