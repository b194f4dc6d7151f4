// Shared memory handling of the backends whose buffers are host memory (ref and cpu):
// 64-byte aligned allocations and plain copies.
#ifndef SLUICE_KERNELS_HOST_BACKEND_H_
#define SLUICE_KERNELS_HOST_BACKEND_H_

#include <cstddef>

#include "kernels/backend.h"

namespace sluice::kernels {

class HostBackend : public Backend {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;
  absl::Status CopyOnDevice(absl::Span<const Copy> copies) override;

 protected:
  // KvMoveSlot (kernels/kv_format.h) move by move, slot by slot.
  absl::Status DoKvMoveSlots(const KvMoveSlotsParams& p) override;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_HOST_BACKEND_H_
