// CUB for the CPU emulation: the block scan and reduce and the device scan the kernels use, with
// CUB's contracts made observable. Block collectives go through their TempStorage in shared
// memory and the block barrier, so reusing the storage without a __syncthreads in between reads
// another collective's values; BlockReduce's result is poison outside thread 0, where CUB leaves
// it undefined; DeviceScan asks for temporary storage and checks it is given.
#ifndef SLUICE_KERNELS_CUDA_EMU_CUB_H_
#define SLUICE_KERNELS_CUDA_EMU_CUB_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <type_traits>

#include "kernels/cuda/emu/device.h"
#include "kernels/cuda/emu/runtime.h"

namespace sluice::emu {
[[noreturn]] void Fault(const std::string& message);
}  // namespace sluice::emu

namespace cub {

namespace detail {

template <typename T>
T Poison() {
  T v;
  std::memset(static_cast<void*>(&v), 0xff, sizeof(T));
  return v;
}

template <int kThreads>
int LinearThread() {
  const dim3 d = blockDim;
  if (static_cast<int>(d.x * d.y * d.z) != kThreads) {
    ::sluice::emu::Fault("a CUB block collective for " + std::to_string(kThreads) +
                         " threads runs in a block of " + std::to_string(d.x * d.y * d.z));
  }
  return static_cast<int>(threadIdx.x + threadIdx.y * d.x + threadIdx.z * d.x * d.y);
}

}  // namespace detail

struct Sum {
  template <typename T>
  T operator()(const T& a, const T& b) const {
    return a + b;
  }
};

enum BlockScanAlgorithm { BLOCK_SCAN_RAKING, BLOCK_SCAN_RAKING_MEMOIZE, BLOCK_SCAN_WARP_SCANS };
enum BlockReduceAlgorithm {
  BLOCK_REDUCE_RAKING_COMMUTATIVE_ONLY,
  BLOCK_REDUCE_RAKING,
  BLOCK_REDUCE_WARP_REDUCTIONS
};

template <typename T, int BLOCK_DIM_X, BlockScanAlgorithm ALGORITHM = BLOCK_SCAN_RAKING,
          int BLOCK_DIM_Y = 1, int BLOCK_DIM_Z = 1>
class BlockScan {
 public:
  static constexpr int kThreads = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;
  struct TempStorage {
    T values[kThreads];
  };

  explicit BlockScan(TempStorage& storage) : s_(storage) {}

  void ExclusiveSum(T input, T& output) {
    T aggregate;
    ExclusiveScan(input, output, T{}, Sum{}, aggregate);
  }
  void ExclusiveSum(T input, T& output, T& aggregate) {
    ExclusiveScan(input, output, T{}, Sum{}, aggregate);
  }
  void InclusiveSum(T input, T& output) {
    T aggregate;
    InclusiveScan(input, output, Sum{}, aggregate);
  }
  void InclusiveSum(T input, T& output, T& aggregate) {
    InclusiveScan(input, output, Sum{}, aggregate);
  }
  template <typename Op>
  void ExclusiveScan(T input, T& output, T initial, Op op) {
    T aggregate;
    ExclusiveScan(input, output, initial, op, aggregate);
  }
  template <typename Op>
  void ExclusiveScan(T input, T& output, T initial, Op op, T& aggregate) {
    const int me = Publish(input);
    T acc = initial;
    for (int i = 0; i < me; ++i) acc = op(acc, s_.values[i]);
    output = acc;
    aggregate = Total(op);
  }
  template <typename Op>
  void InclusiveScan(T input, T& output, Op op) {
    T aggregate;
    InclusiveScan(input, output, op, aggregate);
  }
  template <typename Op>
  void InclusiveScan(T input, T& output, Op op, T& aggregate) {
    const int me = Publish(input);
    T acc = s_.values[0];
    for (int i = 1; i <= me; ++i) acc = op(acc, s_.values[i]);
    output = acc;
    aggregate = Total(op);
  }

 private:
  int Publish(T input) {
    const int me = detail::LinearThread<kThreads>();
    s_.values[me] = input;
    __syncthreads();
    return me;
  }
  template <typename Op>
  T Total(Op op) {
    T acc = s_.values[0];
    for (int i = 1; i < kThreads; ++i) acc = op(acc, s_.values[i]);
    return acc;
  }

  TempStorage& s_;
};

template <typename T, int BLOCK_DIM_X,
          BlockReduceAlgorithm ALGORITHM = BLOCK_REDUCE_WARP_REDUCTIONS, int BLOCK_DIM_Y = 1,
          int BLOCK_DIM_Z = 1>
class BlockReduce {
 public:
  static constexpr int kThreads = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;
  struct TempStorage {
    T values[kThreads];
  };

  explicit BlockReduce(TempStorage& storage) : s_(storage) {}

  // The block's sum in thread 0; poison elsewhere (CUB: undefined).
  T Sum(T input) { return Reduce(input, cub::Sum{}, kThreads); }
  T Sum(T input, int valid) { return Reduce(input, cub::Sum{}, valid); }
  template <typename Op>
  T Reduce(T input, Op op) {
    return Reduce(input, op, kThreads);
  }
  template <typename Op>
  T Reduce(T input, Op op, int valid) {
    const int me = detail::LinearThread<kThreads>();
    s_.values[me] = input;
    __syncthreads();
    if (me != 0) return detail::Poison<T>();
    T acc = s_.values[0];
    for (int i = 1; i < valid && i < kThreads; ++i) acc = op(acc, s_.values[i]);
    return acc;
  }

 private:
  TempStorage& s_;
};

// Device-wide scans, run on the host in device order.
struct DeviceScan {
  static constexpr size_t kTempBytes = 256;

  template <typename In, typename Out, typename Op, typename Init>
  static cudaError_t ExclusiveScan(void* temp, size_t& temp_bytes, In in, Out out, Op op, Init init,
                                   int64_t items, cudaStream_t stream = nullptr) {
    return Run(temp, temp_bytes, in, out, items, stream, "cub::DeviceScan::ExclusiveScan",
               [op, init](In i, Out o, int64_t n) {
                 Init acc = init;
                 for (int64_t k = 0; k < n; ++k) {
                   const Init x = static_cast<Init>(i[k]);
                   o[k] = acc;
                   acc = op(acc, x);
                 }
               });
  }

  template <typename In, typename Out, typename Op>
  static cudaError_t InclusiveScan(void* temp, size_t& temp_bytes, In in, Out out, Op op,
                                   int64_t items, cudaStream_t stream = nullptr) {
    return Run(temp, temp_bytes, in, out, items, stream, "cub::DeviceScan::InclusiveScan",
               [op](In i, Out o, int64_t n) {
                 using V = typename std::iterator_traits<In>::value_type;
                 V acc{};
                 for (int64_t k = 0; k < n; ++k) {
                   acc = k == 0 ? i[0] : op(acc, i[k]);
                   o[k] = acc;
                 }
               });
  }

  // Accumulates in the input's type, as CUB does.
  template <typename In, typename Out>
  static cudaError_t ExclusiveSum(void* temp, size_t& temp_bytes, In in, Out out, int64_t items,
                                  cudaStream_t stream = nullptr) {
    using V = typename std::iterator_traits<In>::value_type;
    return ExclusiveScan(temp, temp_bytes, in, out, std::plus<>{}, V{}, items, stream);
  }

  template <typename In, typename Out>
  static cudaError_t InclusiveSum(void* temp, size_t& temp_bytes, In in, Out out, int64_t items,
                                  cudaStream_t stream = nullptr) {
    return InclusiveScan(temp, temp_bytes, in, out, std::plus<>{}, items, stream);
  }

 private:
  template <typename In, typename Out, typename F>
  static cudaError_t Run(void* temp, size_t& temp_bytes, In in, Out out, int64_t items,
                         cudaStream_t stream, const char* what, F scan) {
    if (temp == nullptr) {
      temp_bytes = kTempBytes;
      return cudaSuccess;
    }
    if (temp_bytes < kTempBytes || items < 0 ||
        !::sluice::emu::CheckDeviceRange(temp, kTempBytes, what)) {
      return cudaErrorInvalidValue;
    }
    if constexpr (std::is_pointer_v<In>) {
      if (items > 0 && !::sluice::emu::CheckDeviceRange(in, items * sizeof(*in), what, true)) {
        return cudaErrorInvalidValue;
      }
    }
    if constexpr (std::is_pointer_v<Out>) {
      if (items > 0 && !::sluice::emu::CheckDeviceRange(out, items * sizeof(*out), what, true)) {
        return cudaErrorInvalidValue;
      }
    }
    ::sluice::emu::EnqueueDeviceWork(stream, [scan, in, out, items] { scan(in, out, items); });
    return cudaSuccess;
  }
};

}  // namespace cub

#endif  // SLUICE_KERNELS_CUDA_EMU_CUB_H_
