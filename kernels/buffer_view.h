// A buffer an op reads or writes, with its length and the memory it lives in, so that a backend
// can refuse memory it cannot reach and a length that does not cover the op's shapes before any
// kernel runs.
#ifndef SLUICE_KERNELS_BUFFER_VIEW_H_
#define SLUICE_KERNELS_BUFFER_VIEW_H_

#include <cstdint>
#include <string_view>
#include <type_traits>

namespace sluice::kernels {

// Host memory (the ref and cpu backends compute there) or a CUDA backend's device memory.
enum class MemorySpace : uint8_t { kHost = 0, kDevice = 1 };

inline std::string_view MemorySpaceName(MemorySpace space) {
  return space == MemorySpace::kHost ? "host" : "device";
}

// `size` elements of T at `data`, in `space`.
template <typename T>
struct BufferView {
  // Takes no room; stops a bare pointer initializing a view by brace elision (g++ accepts
  // `{.k = ptr}` for a view member and makes a view of 0 elements).
  struct NoBraceElision {};
  [[no_unique_address]] NoBraceElision no_brace_elision;
  T* data = nullptr;
  int64_t size = 0;
  MemorySpace space = MemorySpace::kHost;

  // The elements from `offset` on (0 <= offset <= size).
  BufferView subview(int64_t offset) const {
    return {.data = data + offset, .size = size - offset, .space = space};
  }
  // Read-only, the same elements.
  operator BufferView<const T>() const requires(!std::is_const_v<T>) {
    return {.data = data, .size = size, .space = space};
  }
};

// `size` elements of host memory at `data`.
template <typename T>
BufferView<T> HostView(T* data, int64_t size) {
  return {.data = data, .size = size, .space = MemorySpace::kHost};
}
// The elements of a host container (std::vector, std::array).
template <typename C>
auto HostView(C& c) {
  return HostView(c.data(), static_cast<int64_t>(c.size()));
}

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_BUFFER_VIEW_H_
