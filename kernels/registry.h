// Creating backends by kind, and the default choice: CUDA when a GPU is present, CPU otherwise.
#ifndef SLUICE_KERNELS_REGISTRY_H_
#define SLUICE_KERNELS_REGISTRY_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace sluice::kernels {

// The backend of `kind` with default options; UnavailableError (saying why) when this machine
// cannot run it, e.g. kCuda without a GPU.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(BackendKind kind);

// CUDA if a device is usable, else CPU.
absl::StatusOr<std::unique_ptr<Backend>> CreateDefaultBackend();

// The backend a `--backend` flag names: "cpu" (with `threads` threads, 0 = one per core),
// "cuda" (on GPU `device`, as CUDA numbers the visible ones), "ref", or "auto" (CUDA on `device`
// where it is usable, else the CPU with `threads`). InvalidArgument naming the value for
// anything else, or for a GPU that does not exist; Unavailable, saying why, for "cuda" where no
// GPU is usable.
absl::StatusOr<std::unique_ptr<Backend>> CreateNamedBackend(std::string_view name, int threads = 0,
                                                            int device = 0);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_REGISTRY_H_
