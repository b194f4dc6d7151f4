// An owned buffer on a backend's device, freed when it goes out of scope.
#ifndef SLUICE_KERNELS_DEVICE_BUFFER_H_
#define SLUICE_KERNELS_DEVICE_BUFFER_H_

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace sluice::kernels {

class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Create(Backend& backend, size_t bytes);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }
  // The buffer as elements of T, in its backend's memory.
  template <typename T>
  BufferView<T> view() const {
    return {.data = as<T>(),
            .size = static_cast<int64_t>(bytes_ / sizeof(T)),
            .space = backend_ == nullptr ? MemorySpace::kHost : backend_->memory_space()};
  }

  // Copies `bytes` from host memory at `src` to the start of the buffer, or back.
  absl::Status Upload(const void* src, size_t bytes);
  absl::Status Download(void* dst, size_t bytes) const;

  void Reset();

 private:
  DeviceBuffer(Backend* backend, void* data, size_t bytes)
      : backend_(backend), data_(data), bytes_(bytes) {}

  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_DEVICE_BUFFER_H_
