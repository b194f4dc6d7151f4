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

absl::StatusOr<std::unique_ptr<Backend>> CreateNamedBackend(std::string_view name, int threads,
                                                            int device) {
  const auto cpu = [threads]() -> absl::StatusOr<std::unique_ptr<Backend>> {
    auto backend = CpuBackend::Create({.threads = threads});
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
  };
  const auto cuda = [device]() -> absl::StatusOr<std::unique_ptr<Backend>> {
    auto gpu = CudaBackend::Create({.device = device});
    if (!gpu.ok()) return gpu.status();
    return std::unique_ptr<Backend>(std::move(*gpu));
  };
  if (name == "cpu") return cpu();
  if (name == "cuda") return cuda();
  if (name == "ref") return CreateBackend(BackendKind::kRef);
  if (name == "auto") {
    // A GPU that is there but not usable falls back to the CPU; one that is not there is the
    // caller's mistake.
    auto gpu = cuda();
    if (gpu.ok() || absl::IsInvalidArgument(gpu.status())) return gpu;
    return cpu();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--backend=%s: expected auto, cpu, cuda or ref", name));
}

}  // namespace sluice::kernels
