// The reference backend: straightforward scalar loops with double accumulation, in host
// memory. Slow on purpose; it is the oracle for every other backend.
#ifndef SLUICE_KERNELS_REF_REF_BACKEND_H_
#define SLUICE_KERNELS_REF_REF_BACKEND_H_

#include <string>

#include "kernels/host_backend.h"

namespace sluice::kernels {

class RefBackend final : public HostBackend {
 public:
  BackendKind kind() const override { return BackendKind::kRef; }
  std::string name() const override { return "ref"; }
  bool Supports(Op op) const override;

 protected:
  absl::Status DoRmsNorm(const RmsNormParams& p) override;
  absl::Status DoMatmul(const MatmulParams& p) override;
  absl::Status DoGetRows(const GetRowsParams& p) override;
  absl::Status DoRope(const RopeParams& p) override;
  absl::Status DoSwiGlu(const SwiGluParams& p) override;
  absl::Status DoSoftmax(const SoftmaxParams& p) override;
  absl::Status DoAttention(const AttentionParams& p) override;
  absl::Status DoKvQuantize(const KvQuantizeParams& p) override;
  absl::Status DoKvDequantize(const KvDequantizeParams& p) override;
  absl::Status DoPagedAttention(const PagedAttentionParams& p) override;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_REF_REF_BACKEND_H_
