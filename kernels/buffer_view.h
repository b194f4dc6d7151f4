// A buffer an op reads or writes, with its length and the memory it lives in, so that a backend
// can refuse memory it cannot reach and a length that does not cover the op's shapes before any
// kernel runs.
#ifndef SLUICE_KERNELS_BUFFER_VIEW_H_
#define SLUICE_KERNELS_BUFFER_VIEW_H_

#include <cstdint>
#include <string_view>

namespace sluice::kernels {

// Host memory (the ref and cpu backends compute there) or a CUDA backend's device memory.
enum class MemorySpace : uint8_t { kHost = 0, kDevice = 1 };

inline std::string_view MemorySpaceName(MemorySpace space) {
  return space == MemorySpace::kHost ? "host" : "device";
}

// `size` elements of T at `data`, in `space`.
template <typename T>
struct BufferView {
  T* data = nullptr;
  int64_t size = 0;
  MemorySpace space = MemorySpace::kHost;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_BUFFER_VIEW_H_
