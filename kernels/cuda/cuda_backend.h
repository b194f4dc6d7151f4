// The CUDA backend: device memory, one stream, and the .cu kernels of this directory.
#ifndef SLUICE_KERNELS_CUDA_CUDA_BACKEND_H_
#define SLUICE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace sluice::kernels {

struct CudaOptions {
  int device = 0;
};

class CudaBackend final : public Backend {
 public:
  // UnavailableError, saying why, on a machine without a usable GPU.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaOptions& options = {});
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::kCuda; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  std::string name() const override { return name_; }
  bool Supports(Op op) const override;

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;
  absl::Status CopyOnDevice(absl::Span<const Copy> copies) override;
  bool CanRecord() const override { return true; }

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
  absl::Status DoKvMoveSlots(const KvMoveSlotsParams& p) override;
  absl::Status DoPagedAttention(const PagedAttentionParams& p) override;
  absl::Status DoBatchPagedAttention(const BatchPagedAttentionParams& p,
                                     absl::Span<const PagedAttentionParams> sequences) override;
  bool PlansBatchPagedAttention() const override { return true; }
  absl::StatusOr<std::unique_ptr<BatchAttentionPlan>> DoPlanBatchPagedAttention(
      const BatchPagedAttentionStep& step,
      absl::Span<const std::vector<PagedAttentionParams>> layers) override;
  absl::StatusOr<std::unique_ptr<Recording>> DoRecord(
      absl::FunctionRef<absl::Status()> ops) override;
  absl::Status DoReplay(const Recording& recording) override;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl, std::string name);

  std::unique_ptr<Impl> impl_;
  const std::string name_;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_CUDA_CUDA_BACKEND_H_
