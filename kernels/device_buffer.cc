#include "kernels/device_buffer.h"

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace sluice::kernels {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(Backend& backend, size_t bytes) {
  SLUICE_ASSIGN_OR_RETURN(void* data, backend.Allocate(bytes));
  return DeviceBuffer(&backend, data, bytes);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status DeviceBuffer::Upload(const void* src, size_t bytes) {
  if (bytes > bytes_) {
    return absl::OutOfRangeError(
        absl::StrFormat("upload of %d bytes into a %d-byte buffer", bytes, bytes_));
  }
  return backend_->CopyToDevice(data_, src, bytes);
}

absl::Status DeviceBuffer::Download(void* dst, size_t bytes) const {
  if (bytes > bytes_) {
    return absl::OutOfRangeError(
        absl::StrFormat("download of %d bytes from a %d-byte buffer", bytes, bytes_));
  }
  return backend_->CopyToHost(dst, data_, bytes);
}

void DeviceBuffer::Reset() {
  if (backend_ != nullptr && data_ != nullptr) backend_->Free(data_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace sluice::kernels
