#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/batched_copy.h"
#include "kernels/cuda/cublas_status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/get_rows.h"
#include "kernels/cuda/kv_huffman_ops.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/kv_slot_copy.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"

namespace sluice::kernels {
namespace {

absl::Status NotWhileRecording(std::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrFormat("recording CUDA ops: %s cannot be recorded (it allocates, uses the "
                      "backend's workspace, copies through host memory or waits for the GPU)",
                      what));
}

// A recording: the captured ops as an executable graph.
class CudaRecording final : public Backend::Recording {
 public:
  explicit CudaRecording(cudaGraphExec_t exec) : exec_(exec) {}
  // An executable graph still running is freed when it completes.
  ~CudaRecording() override { cudaGraphExecDestroy(exec_); }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraphExec_t exec_;
};

}  // namespace

struct CudaBackend::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;  // bound to `stream`, pedantic (true fp32) math
  // Device scratch of the ops on `stream` (matmul's expanded weights, attention's row
  // statistics). Ops run in stream order, so one op is done with it before the next starts.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // PagedAttention's plans, built in place on every call without allocating.
  kernels::cuda::DecodeAttentionWorkspace decode_workspace;
  // Step plans (PlanBatchPagedAttention) have their own, so calls between a step's layers that
  // plan for themselves do not overwrite the step's plan.
  kernels::cuda::DecodeAttentionWorkspace step_workspace;
  // Inside Record: `stream` is capturing, so nothing may wait for it, allocate or use the
  // workspace (a later growth would free what the recording names).
  bool recording = false;

  // Releases in reverse order of creation, after the stream's work has finished.
  ~Impl() {
    if (stream == nullptr) return;
    cudaSetDevice(device);
    cudaStreamSynchronize(stream);
    if (workspace != nullptr) cudaFree(workspace);
    if (cublas != nullptr) cublasDestroy(cublas);
    cudaStreamDestroy(stream);
  }

  // At least `bytes` of workspace. Growing waits for the stream (the old buffer may still be in
  // use) and rounds up to 1 MiB; the workspace never shrinks.
  absl::StatusOr<void*> Workspace(size_t bytes) {
    if (recording) return NotWhileRecording("an op that uses the backend's workspace");
    if (bytes <= workspace_bytes) return workspace;
    constexpr size_t kGranule = size_t{1} << 20;
    const size_t rounded = (bytes + kGranule - 1) / kGranule * kGranule;
    if (workspace != nullptr) {
      SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      SLUICE_CUDA_RETURN_IF_ERROR(cudaFree(workspace));
      workspace = nullptr;
      workspace_bytes = 0;
    }
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace, rounded));
    workspace_bytes = rounded;
    return workspace;
  }
};

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaOptions& options) {
  SLUICE_RETURN_IF_ERROR(kernels::cuda::CudaDeviceAvailable());
  int count = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA device %d does not exist (%d present)", options.device, count));
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp prop;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  auto impl = std::make_unique<Impl>();
  impl->device = options.device;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasCreate(&impl->cublas));
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(impl->cublas, impl->stream));
  // Pedantic: fp32 GEMMs stay fp32 (no TF32 tensor cores, no bf16x9 emulation, whatever the
  // environment says); matmul_test bounds the error at 2e-6 of sum |x| |w|.
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(impl->cublas, CUBLAS_PEDANTIC_MATH));
  return std::unique_ptr<CudaBackend>(new CudaBackend(
      std::move(impl), absl::StrFormat("cuda (%s, sm_%d%d)", prop.name, prop.major, prop.minor)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl, std::string name)
    : impl_(std::move(impl)), name_(std::move(name)) {}

CudaBackend::~CudaBackend() = default;  // Impl releases the stream and what uses it

bool CudaBackend::Supports(Op op) const {
  // The other ops run on the CPU backend until their CUDA kernels land.
  return op == Op::kRmsNorm || op == Op::kMatmul || op == Op::kGetRows || op == Op::kRope ||
         op == Op::kSwiGlu || op == Op::kSoftmax || op == Op::kAttention || op == Op::kKvQuantize ||
         op == Op::kKvDequantize || op == Op::kPagedAttention || op == Op::kBatchPagedAttention ||
         op == Op::kKvMoveSlots;
}

absl::StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
  if (impl_->recording) return NotWhileRecording("Allocate");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  void* p = nullptr;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  return p;
}

void CudaBackend::Free(void* ptr) {
  if (ptr == nullptr) return;
  cudaSetDevice(impl_->device);
  cudaFree(ptr);
}

absl::Status CudaBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (impl_->recording) return NotWhileRecording("CopyToDevice");
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl_->stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (impl_->recording) return NotWhileRecording("CopyToHost");
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyOnDevice(absl::Span<const Copy> copies) {
  std::vector<kernels::cuda::CopyRange> ranges;
  for (const Copy& c : copies) {
    if (c.bytes > 0) ranges.push_back({.dst = c.dst, .src = c.src, .bytes = c.bytes});
  }
  // One copy goes to the copy engine; more go to one kernel launch per kMaxCopiesPerLaunch.
  if (ranges.size() == 1) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ranges[0].dst, ranges[0].src, ranges[0].bytes,
                                                cudaMemcpyDeviceToDevice, impl_->stream));
    return absl::OkStatus();
  }
  kernels::cuda::BatchedCopyParams batch;
  for (size_t first = 0; first < ranges.size(); first += kernels::cuda::kMaxCopiesPerLaunch) {
    batch.count = static_cast<int32_t>(
        std::min<size_t>(ranges.size() - first, kernels::cuda::kMaxCopiesPerLaunch));
    std::copy_n(ranges.begin() + first, batch.count, batch.ranges);
    SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchBatchedCopy(batch, impl_->stream));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Synchronize() {
  if (impl_->recording) return NotWhileRecording("Synchronize");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoKvQuantize(const KvQuantizeParams& p) {
  if (p.format.huffman_bits > 0) return kernels::cuda::KvQuantizeHuffman(p, impl_->stream);
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchKvQuantize(p, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoKvQuantizeBatch(absl::Span<const KvQuantizeParams> items) {
  // Huffman-coded writes size their units on the host, one by one; the fixed-width ones go to
  // the device as one launch (the plan skips the others).
  for (const KvQuantizeParams& p : items) {
    if (p.tokens == 0) {
      if (p.tokens_written != nullptr) *p.tokens_written = 0;
    } else if (p.format.huffman_bits > 0) {
      SLUICE_RETURN_IF_ERROR(kernels::cuda::KvQuantizeHuffman(p, impl_->stream));
    }
  }
  const kernels::cuda::KvQuantizeBatchImage image =
      kernels::cuda::PlanKvQuantizeBatch(items.data(), static_cast<int64_t>(items.size()));
  if (image.count == 0) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(void* device_image, impl_->Workspace(image.bytes.size()));
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchKvQuantizeBatch(
      image, static_cast<uint8_t*>(device_image), impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoKvDequantize(const KvDequantizeParams& p) {
  if (p.format.huffman_bits > 0) return kernels::cuda::KvDequantizeHuffman(p, impl_->stream);
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchKvDequantize(p, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoKvMoveSlots(const KvMoveSlotsParams& p) {
  // The moves go to the workspace (stream order keeps it theirs until the copy has run).
  std::vector<kernels::cuda::DeviceSlotMove> moves(p.count);
  for (int64_t i = 0; i < p.count; ++i) {
    const KvSlotMove& m = p.moves[i];
    moves[i] = {.src_page = m.src_page,
                .src_slot = m.src_slot,
                .dst_page = m.dst_page,
                .dst_slot = m.dst_slot,
                .slots = m.slots,
                .src_used = p.layout.tokens};
  }
  const size_t bytes = moves.size() * sizeof(moves[0]);
  SLUICE_ASSIGN_OR_RETURN(void* device_moves, impl_->Workspace(bytes));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_moves, moves.data(), bytes, cudaMemcpyHostToDevice, impl_->stream));
  const kernels::cuda::SparseCopyParams copy{
      .arena = p.pool.data,
      .page_bytes = p.page_bytes,
      .layout = kernels::cuda::SlotCopyLayoutOf(p.format, p.layout),
      .moves = static_cast<const kernels::cuda::DeviceSlotMove*>(device_moves),
      .num_moves = p.count,
      .clear_source = false};
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchSparseCopy(copy, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoPagedAttention(const PagedAttentionParams& p) {
  return kernels::cuda::PagedAttention(p, impl_->stream, &impl_->decode_workspace);
}

absl::Status CudaBackend::DoBatchPagedAttention(const BatchPagedAttentionParams& p,
                                                absl::Span<const PagedAttentionParams> sequences) {
  if (p.plan != nullptr) {
    const auto* step = dynamic_cast<const kernels::cuda::DecodeStepPlan*>(p.plan);
    if (step == nullptr) {
      return absl::InvalidArgumentError(
          "batch_paged_attention: the plan was not made by this backend's "
          "PlanBatchPagedAttention");
    }
    return step->Run(p, sequences, impl_->stream);
  }
  if (!kernels::cuda::RunsAsOnePlan(p, sequences)) {
    return Backend::DoBatchPagedAttention(p, sequences);  // sequence by sequence
  }
  return kernels::cuda::BatchPagedAttention(p, sequences, impl_->stream, &impl_->decode_workspace);
}

absl::StatusOr<std::unique_ptr<BatchAttentionPlan>> CudaBackend::DoPlanBatchPagedAttention(
    const BatchPagedAttentionStep& step,
    absl::Span<const std::vector<PagedAttentionParams>> layers) {
  return kernels::cuda::DecodeStepPlan::Create(this, step, layers, impl_->stream,
                                               &impl_->step_workspace);
}

absl::StatusOr<std::unique_ptr<Backend::Recording>> CudaBackend::DoRecord(
    absl::FunctionRef<absl::Status()> ops) {
  if (impl_->recording) return NotWhileRecording("Record");
  // Thread-local mode: other threads' allocations and synchronizations stay allowed.
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(impl_->stream, cudaStreamCaptureModeThreadLocal));
  impl_->recording = true;
  const absl::Status recorded = ops();
  impl_->recording = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(impl_->stream, &graph);
  if (!recorded.ok() || ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // a refused call's error is not the next launch's
    if (!recorded.ok()) return recorded;
    return NotWhileRecording(
        absl::StrFormat("an op (the capture ended with %s)", cudaGetErrorName(ended)));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  SLUICE_CUDA_RETURN_IF_ERROR(instantiated);
  return std::make_unique<CudaRecording>(exec);
}

absl::Status CudaBackend::DoReplay(const Recording& recording) {
  const auto* cuda = dynamic_cast<const CudaRecording*>(&recording);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError("replay: the recording was not made by a CUDA backend");
  }
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(cuda->exec(), impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoRmsNorm(const RmsNormParams& p) {
  if (p.rows > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rms_norm: rows=%d exceeds grid limit", p.rows));
  }
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchRmsNorm(p, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoMatmul(const MatmulParams& p) {
  void* workspace = nullptr;
  if (const size_t bytes = kernels::cuda::MatmulWorkspaceBytes(p); bytes > 0) {
    absl::StatusOr<void*> w = impl_->Workspace(bytes);
    if (!w.ok()) return w.status();
    workspace = *w;
  }
  return kernels::cuda::Matmul(p, impl_->cublas, static_cast<float*>(workspace), impl_->stream);
}

absl::Status CudaBackend::DoGetRows(const GetRowsParams& p) {
  if (p.count > INT_MAX) {
    return absl::UnimplementedError(
        absl::StrFormat("get_rows: count=%d exceeds the CUDA grid limit", p.count));
  }
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchGetRows(p, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoRope(const RopeParams& p) {
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchRope(p, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoSwiGlu(const SwiGluParams& p) {
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchSwiGlu(p, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoSoftmax(const SoftmaxParams& p) {
  if (p.rows > INT_MAX) {
    return absl::UnimplementedError(
        absl::StrFormat("softmax: rows=%d exceeds the CUDA grid limit", p.rows));
  }
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchSoftmax(p, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoAttention(const AttentionParams& p) {
  if (!kernels::cuda::AttentionSupportsHeadDim(p.head_dim)) {
    return absl::UnimplementedError(
        absl::StrFormat("attention: head_dim %d is not compiled into the CUDA backend (it has %s)",
                        p.head_dim, kernels::cuda::kAttentionHeadDims));
  }
  if (p.q_tokens * p.heads > INT_MAX || p.kv_tokens > INT_MAX || p.heads > 65535) {
    return absl::UnimplementedError(absl::StrFormat(
        "attention: q_tokens=%d heads=%d kv_tokens=%d exceed the CUDA kernels' 32-bit sizes",
        p.q_tokens, p.heads, p.kv_tokens));
  }
  void* workspace = nullptr;
  if (const size_t bytes = kernels::cuda::AttentionWorkspaceBytes(p); bytes > 0) {
    absl::StatusOr<void*> w = impl_->Workspace(bytes);
    if (!w.ok()) return w.status();
    workspace = *w;
  }
  SLUICE_CUDA_RETURN_IF_ERROR(
      kernels::cuda::LaunchAttention(p, static_cast<float*>(workspace), impl_->stream));
  return absl::OkStatus();
}

}  // namespace sluice::kernels
