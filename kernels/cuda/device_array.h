// Owned CUDA memory: a typed device array, a pinned host array for asynchronous copies, and an
// event; each freed by its destructor on every path. Also whether a CUDA device is usable.
//
//   SLUICE_ASSIGN_OR_RETURN(auto ids, DeviceArray<int32_t>::Create(n));
//   SLUICE_RETURN_IF_ERROR(ids.Reserve(2 * n));  // grows, dropping the old contents
//
// Arrays grow but never shrink, so scratch space reaches its high-water mark and stays there.
// Growing frees the old memory with cudaFree/cudaFreeHost, which wait for the device: callers
// must not grow an array that queued work still reads or writes.
#ifndef SLUICE_KERNELS_CUDA_DEVICE_ARRAY_H_
#define SLUICE_KERNELS_CUDA_DEVICE_ARRAY_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"

namespace sluice::kernels::cuda {

// Whether this process can use a CUDA device: Unavailable, with CUDA's reason, when
// cudaGetDeviceCount fails or finds none.
inline absl::Status CudaDeviceAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not blamed for it
    return absl::UnavailableError(absl::StrFormat("no usable CUDA device: %s (%s)",
                                                  cudaGetErrorString(err), cudaGetErrorName(err)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device: cudaGetDeviceCount() found 0");
  return absl::OkStatus();
}

// Whether `size` elements of T have a byte count that size_t and int64_t both hold. (The
// bound is computed in uint64_t: SIZE_MAX / sizeof(uint8_t) cast to int64_t is -1.)
template <typename T>
constexpr bool FitsInBytes(int64_t size) {
  return size >= 0 && static_cast<uint64_t>(size) <= static_cast<uint64_t>(INT64_MAX) / sizeof(T);
}

// `size` elements of T in device memory (cudaMalloc); uninitialized.
template <typename T>
class DeviceArray {
 public:
  static absl::StatusOr<DeviceArray> Create(int64_t size) {
    DeviceArray a;
    absl::Status s = a.Reserve(size);
    if (!s.ok()) return s;
    return a;
  }

  DeviceArray() = default;
  DeviceArray(DeviceArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { Reset(); }

  // Makes room for at least `size` elements; the contents are lost if the array grows.
  absl::Status Reserve(int64_t size) {
    if (size <= size_) return absl::OkStatus();
    if (!FitsInBytes<T>(size)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a device array of %d elements of %d bytes overflows", size, sizeof(T)));
    }
    Reset();
    void* p = nullptr;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, static_cast<size_t>(size) * sizeof(T)));
    data_ = static_cast<T*>(p);
    size_ = size;
    return absl::OkStatus();
  }

  void Reset() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data() const { return data_; }
  int64_t size() const { return size_; }
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(T); }

 private:
  T* data_ = nullptr;
  int64_t size_ = 0;
};

// `size` elements of T in page-locked host memory (cudaMallocHost), so that cudaMemcpyAsync
// from or to it does not wait for the host; uninitialized.
template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  PinnedArray(PinnedArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  PinnedArray& operator=(PinnedArray&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() { Reset(); }

  absl::Status Reserve(int64_t size) {
    if (size <= size_) return absl::OkStatus();
    if (!FitsInBytes<T>(size)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a pinned array of %d elements of %d bytes overflows", size, sizeof(T)));
    }
    Reset();
    void* p = nullptr;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, static_cast<size_t>(size) * sizeof(T)));
    data_ = static_cast<T*>(p);
    size_ = size;
    return absl::OkStatus();
  }

  void Reset() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  int64_t size_ = 0;
};

// A CUDA event without timing (cudaEventDisableTiming) unless `timing` is set.
class CudaEvent {
 public:
  static absl::StatusOr<CudaEvent> Create(bool timing = false) {
    CudaEvent e;
    SLUICE_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&e.event_, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }

  CudaEvent() = default;
  CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& other) noexcept {
    if (this != &other) {
      Reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() { Reset(); }

  cudaEvent_t get() const { return event_; }

  void Reset() {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = nullptr;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace sluice::kernels::cuda

#endif  // SLUICE_KERNELS_CUDA_DEVICE_ARRAY_H_
