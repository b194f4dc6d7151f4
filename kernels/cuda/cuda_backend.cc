#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/rmsnorm.h"

namespace sluice::kernels {

struct CudaBackend::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
};

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrFormat("no usable CUDA device: %s (%s)",
                                                  cudaGetErrorString(err), cudaGetErrorName(err)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device: cudaGetDeviceCount() found 0");
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
  return std::unique_ptr<CudaBackend>(new CudaBackend(
      std::move(impl), absl::StrFormat("cuda (%s, sm_%d%d)", prop.name, prop.major, prop.minor)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl, std::string name)
    : impl_(std::move(impl)), name_(std::move(name)) {}

CudaBackend::~CudaBackend() {
  if (impl_ && impl_->stream != nullptr) {
    cudaSetDevice(impl_->device);
    cudaStreamSynchronize(impl_->stream);
    cudaStreamDestroy(impl_->stream);
  }
}

bool CudaBackend::Supports(Op op) const {
  // The other ops run on the CPU backend until their CUDA kernels land.
  return op == Op::kRmsNorm || op == Op::kKvQuantize || op == Op::kKvDequantize;
}

absl::StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
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
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl_->stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::Synchronize() {
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoKvQuantize(const KvQuantizeParams& p) {
  if (p.format.huffman_bits > 0) {
    return absl::UnimplementedError("kv_quantize: Huffman-coded tiers are not on CUDA yet");
  }
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchKvQuantize(p, impl_->stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoKvDequantize(const KvDequantizeParams& p) {
  if (p.format.huffman_bits > 0) {
    return absl::UnimplementedError("kv_dequantize: Huffman-coded tiers are not on CUDA yet");
  }
  SLUICE_CUDA_RETURN_IF_ERROR(kernels::cuda::LaunchKvDequantize(p, impl_->stream));
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

}  // namespace sluice::kernels
