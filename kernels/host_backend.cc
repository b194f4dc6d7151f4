#include "kernels/host_backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/kv_format.h"

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

absl::Status HostBackend::DoKvMoveSlots(const KvMoveSlotsParams& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    const KvSlotMove& m = p.moves[i];
    const uint8_t* src = p.pool.data + m.src_page * p.page_bytes;
    uint8_t* dst = p.pool.data + m.dst_page * p.page_bytes;
    for (int32_t k = 0; k < m.slots; ++k) {
      KvMoveSlot(p.format, p.layout, src, m.src_slot + k, dst, m.dst_slot + k);
    }
  }
  return absl::OkStatus();
}

absl::Status HostBackend::CopyOnDevice(absl::Span<const Copy> copies) {
  for (const Copy& c : copies) {
    if (c.bytes > 0) std::memcpy(c.dst, c.src, c.bytes);
  }
  return absl::OkStatus();
}

}  // namespace sluice::kernels
