#include "kernels/registry.h"

#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/ref/ref_backend.h"

namespace sluice::kernels {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(BackendKind kind) {
  switch (kind) {
    case BackendKind::kRef:
      return std::unique_ptr<Backend>(std::make_unique<RefBackend>());
    case BackendKind::kCpu: {
      auto cpu = CpuBackend::Create();
      if (!cpu.ok()) return cpu.status();
      return std::unique_ptr<Backend>(std::move(*cpu));
    }
    case BackendKind::kCuda: {
      auto gpu = CudaBackend::Create();
      if (!gpu.ok()) return gpu.status();
      return std::unique_ptr<Backend>(std::move(*gpu));
    }
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

absl::StatusOr<std::unique_ptr<Backend>> CreateDefaultBackend() {
  return CreateNamedBackend("auto");
}

absl::StatusOr<std::unique_ptr<Backend>> CreateNamedBackend(std::string_view name, int threads) {
  const auto cpu = [threads]() -> absl::StatusOr<std::unique_ptr<Backend>> {
    auto backend = CpuBackend::Create({.threads = threads});
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
  };
  if (name == "cpu") return cpu();
  if (name == "cuda") return CreateBackend(BackendKind::kCuda);
  if (name == "ref") return CreateBackend(BackendKind::kRef);
  if (name == "auto") {
    auto gpu = CreateBackend(BackendKind::kCuda);
    if (gpu.ok()) return gpu;
    return cpu();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--backend=%s: expected auto, cpu, cuda or ref", name));
}

}  // namespace sluice::kernels
