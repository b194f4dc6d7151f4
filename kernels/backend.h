// The one interface every compute backend implements (ref, cpu, cuda).
//
// A backend owns buffers on its device and runs ops on them. Callers ask `Supports(op)` before
// relying on an op; an unsupported op returns absl::UnimplementedError, never a silent fallback
// to another backend. Public op methods validate their parameter struct once, here, and then
// call the backend's `Do*` implementation.
#ifndef SLUICE_KERNELS_BACKEND_H_
#define SLUICE_KERNELS_BACKEND_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/op_params.h"

namespace sluice::kernels {

enum class BackendKind { kRef, kCpu, kCuda };
std::string_view BackendKindName(BackendKind kind);

enum class Op {
  kRmsNorm,
  kMatmul,
  kGetRows,
  kRope,
  kSwiGlu,
  kSoftmax,
  kAttention,
  kKvQuantize,
  kKvDequantize,
  kPagedAttention,
  kBatchPagedAttention,
  kKvMoveSlots,
};
std::string_view OpName(Op op);

// Layer `layer` of a step as a BatchPagedAttentionParams call (q, out and scores unset).
BatchPagedAttentionParams LayerOfStep(const BatchPagedAttentionStep& step, int64_t layer);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendKind kind() const = 0;
  // Human-readable, e.g. "cpu (avx512, 2 threads)" or "cuda (NVIDIA H100, sm_90)".
  virtual std::string name() const = 0;
  virtual bool Supports(Op op) const = 0;
  // Where its ops read and write: host memory (ref, cpu) or its device (cuda).
  virtual MemorySpace memory_space() const { return MemorySpace::kHost; }

  // Buffers on this backend's device; host memory for ref and cpu.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Waits until every op issued so far has finished; reports asynchronous failures.
  virtual absl::Status Synchronize() = 0;
  // Copies between buffers of this backend, in order with its ops (asynchronous on a device: the
  // sources must hold until the next Synchronize or host copy). A call's copies must not
  // overlap one another (none may read what another writes): a device runs them in any order.
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  virtual absl::Status CopyOnDevice(absl::Span<const Copy> copies) = 0;

  // ---- ops ----
  absl::Status RmsNorm(const RmsNormParams& p);
  absl::Status Matmul(const MatmulParams& p);
  absl::Status GetRows(const GetRowsParams& p);
  absl::Status Rope(const RopeParams& p);
  absl::Status SwiGlu(const SwiGluParams& p);
  absl::Status Softmax(const SoftmaxParams& p);
  absl::Status Attention(const AttentionParams& p);
  absl::Status KvQuantize(const KvQuantizeParams& p);
  // Many KvQuantize calls as one (a decode step's new tokens, every sequence's): each item is
  // validated as a call of its own; items must write distinct pages (the CPU backend runs them in
  // parallel).
  absl::Status KvQuantizeBatch(absl::Span<const KvQuantizeParams> items);
  absl::Status KvDequantize(const KvDequantizeParams& p);
  // Copies slots between pages of a pool (compaction; see KvMoveSlotsParams).
  absl::Status KvMoveSlots(const KvMoveSlotsParams& p);
  absl::Status PagedAttention(const PagedAttentionParams& p);
  // Validates the batch as a whole and each sequence as a PagedAttentionParams of its own, then
  // runs DoBatchPagedAttention.
  absl::Status BatchPagedAttention(const BatchPagedAttentionParams& p);
  // Plans a decode step's BatchPagedAttention calls once for every layer (validated as those
  // calls will be, less their queries and outputs). Null when the backend has nothing to plan
  // for it (the calls then run as they would without a plan). The plan stays valid until the
  // next PlanBatchPagedAttention on this backend, and while the step's pages do not change.
  absl::StatusOr<std::unique_ptr<BatchAttentionPlan>> PlanBatchPagedAttention(
      const BatchPagedAttentionStep& step);

  // ---- recorded ops (CUDA graphs) ----
  // Ops recorded once and issued again with one launch, for sequences of small ops whose launches
  // cost more than their work (a decode step's dense layers at small batches). A recording keeps
  // its ops' parameters as they were when recorded: the buffers they name must keep their
  // addresses and outlive it; what the buffers hold is read when it runs.
  class Recording {
   public:
    virtual ~Recording() = default;
  };
  // Whether Record works on this backend (CUDA: stream capture into a graph). Host backends run
  // each op as it comes and have nothing to record.
  virtual bool CanRecord() const { return false; }
  // Records the ops that `ops` issues, without running them. FailedPreconditionError, nothing
  // run, when one cannot be recorded: it allocates, uses a backend workspace (which may move),
  // copies through host memory or waits for the device. UnimplementedError where !CanRecord().
  absl::StatusOr<std::unique_ptr<Recording>> Record(absl::FunctionRef<absl::Status()> ops);
  // Issues a recording's ops, in order with this backend's other ops.
  absl::Status Replay(const Recording& recording);

 protected:
  virtual absl::Status DoRmsNorm(const RmsNormParams& p);
  virtual absl::Status DoMatmul(const MatmulParams& p);
  virtual absl::Status DoGetRows(const GetRowsParams& p);
  virtual absl::Status DoRope(const RopeParams& p);
  virtual absl::Status DoSwiGlu(const SwiGluParams& p);
  virtual absl::Status DoSoftmax(const SoftmaxParams& p);
  virtual absl::Status DoAttention(const AttentionParams& p);
  virtual absl::Status DoKvQuantize(const KvQuantizeParams& p);
  // The default runs the items one after the other through DoKvQuantize.
  virtual absl::Status DoKvQuantizeBatch(absl::Span<const KvQuantizeParams> items);
  virtual absl::Status DoKvDequantize(const KvDequantizeParams& p);
  virtual absl::Status DoKvMoveSlots(const KvMoveSlotsParams& p);
  virtual absl::Status DoPagedAttention(const PagedAttentionParams& p);
  // `sequences` are the batch's sequences as calls of their own (their page refs resolved from
  // the page tables, their scores pointing into the batch's arrays). The default runs them one
  // after the other through DoPagedAttention; a backend that can run them together overrides it.
  virtual absl::Status DoBatchPagedAttention(const BatchPagedAttentionParams& p,
                                             absl::Span<const PagedAttentionParams> sequences);
  // Whether the backend plans a step's BatchPagedAttention; without, PlanBatchPagedAttention
  // returns null at once (no validation pass over the step).
  virtual bool PlansBatchPagedAttention() const { return false; }
  // `layers[l]` are layer l's sequences as DoBatchPagedAttention would get them. The default
  // plans nothing (returns null).
  virtual absl::StatusOr<std::unique_ptr<BatchAttentionPlan>> DoPlanBatchPagedAttention(
      const BatchPagedAttentionStep& step,
      absl::Span<const std::vector<PagedAttentionParams>> layers);

  // The defaults return UnimplementedError.
  virtual absl::StatusOr<std::unique_ptr<Recording>> DoRecord(
      absl::FunctionRef<absl::Status()> ops);
  virtual absl::Status DoReplay(const Recording& recording);

  absl::Status Unsupported(Op op) const;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_BACKEND_H_
