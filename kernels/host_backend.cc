#include "kernels/host_backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"

namespace sluice::kernels {

namespace {
constexpr size_t kAlignment = 64;
}  // namespace

absl::StatusOr<void*> HostBackend::Allocate(size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: cannot allocate %d bytes", name(), bytes));
  }
  return p;
}

void HostBackend::Free(void* ptr) { std::free(ptr); }

absl::Status HostBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostBackend::Synchronize() { return absl::OkStatus(); }

absl::Status HostBackend::CopyOnDevice(absl::Span<const Copy> copies) {
  for (const Copy& c : copies) {
    if (c.bytes > 0) std::memcpy(c.dst, c.src, c.bytes);
  }
  return absl::OkStatus();
}

}  // namespace sluice::kernels
