// The CUDA runtime API of the emulation: the subset of cuda_runtime_api.h the project uses,
// implemented on the host. One emulated device, shaped like an H100 (132 SMs, 227 KiB of
// opt-in shared memory per block), with one in-order queue for every stream: launches,
// asynchronous copies and memsets wait in it until something synchronizes (a stream or device
// synchronization, a synchronous copy, a copy to or from pageable host memory, cudaFree), so
// host code that reads a result before synchronizing sees stale memory, as on a GPU.
//
// Device memory is host memory from posix_memalign, exactly as long as asked (ASan bounds it)
// and filled with 0xff bytes, as cudaMalloc leaves it uninitialized. Every allocation is
// registered: copies, memsets and frees of pointers outside one (or of the wrong kind) fail with
// cudaErrorInvalidValue and say why on stderr. What it does not detect: host code dereferencing
// a device pointer, and kernels dereferencing pageable host memory.
#ifndef SLUICE_KERNELS_CUDA_EMU_RUNTIME_H_
#define SLUICE_KERNELS_CUDA_EMU_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>

#include "kernels/cuda/emu/device.h"

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorDevicesUnavailable = 46,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorUnknown = 999,
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrGlobalMemoryBusWidth = 37,
  cudaDevAttrL2CacheSize = 38,
  cudaDevAttrMaxThreadsPerMultiProcessor = 39,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  size_t sharedMemPerMultiprocessor;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsPerMultiProcessor;
  int multiProcessorCount;
  int major;
  int minor;
  int l2CacheSize;
  int memoryBusWidth;
};

struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

constexpr unsigned cudaStreamDefault = 0x00;
constexpr unsigned cudaStreamNonBlocking = 0x01;
constexpr unsigned cudaEventDefault = 0x00;
constexpr unsigned cudaEventBlockingSync = 0x01;
constexpr unsigned cudaEventDisableTiming = 0x02;

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// Stream capture and graphs: while a stream captures, the work issued to it is recorded into
// the capture instead of the queue; a graph launch queues the recorded work again. As on a GPU
// (global and thread-local modes), a call that would wait for the device or allocate while a
// capture is active fails with cudaErrorStreamCaptureUnsupported and invalidates the capture,
// which cudaStreamEndCapture then reports (cudaErrorStreamCaptureInvalidated, no graph).
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

namespace sluice::emu {

// Counts of runtime calls since the process started, for tests of what a code path allocates
// or waits for.
struct RuntimeCounters {
  int64_t device_allocations = 0;  // cudaMalloc
  int64_t device_frees = 0;        // cudaFree
  int64_t host_allocations = 0;    // cudaMallocHost
  int64_t blocking_calls = 0;      // stream / device synchronizations, cudaMemcpy, cudaMemset

  RuntimeCounters operator-(const RuntimeCounters& o) const {
    return {device_allocations - o.device_allocations, device_frees - o.device_frees,
            host_allocations - o.host_allocations, blocking_calls - o.blocking_calls};
  }
};
RuntimeCounters Counters();

// What the emulation keeps per kernel function (cudaFuncSetAttribute).
cudaError_t SetFunctionAttribute(const void* func, cudaFuncAttribute attr, int value);
int MaxDynamicShared(const void* func);
cudaError_t OccupancyBlocksPerSm(int* blocks, int block_threads, size_t dynamic_shared);

// Validates a launch and queues it on the device; a bad configuration becomes the sticky
// cudaGetLastError() value, as on a GPU.
void EnqueueLaunch(const char* name, const void* func, dim3 grid, dim3 block, size_t shared,
                   cudaStream_t stream, std::function<void()> body);
// Queues host work in device order (the cuBLAS and CUB stand-ins' device functions).
void EnqueueDeviceWork(cudaStream_t stream, std::function<void()> work);
// Whether [p, p + bytes) lies in one live device allocation (or, with `pinned_ok`, in one
// page-locked host allocation); otherwise says why on stderr, naming `what`.
bool CheckDeviceRange(const void* p, size_t bytes, const char* what, bool pinned_ok = false);

// kernel<<<grid, block, shared, stream>>>(args...) as Launch(kernel, ...)(args...).
template <typename... P>
class Launcher {
 public:
  Launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
           const char* name)
      : kernel_(kernel),
        grid_(grid),
        block_(block),
        shared_(shared),
        stream_(stream),
        name_(name) {}

  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong argument count");
    // Arguments are converted to the parameter types and copied at launch, as CUDA does.
    auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(args)...);
    void (*kernel)(P...) = kernel_;
    EnqueueLaunch(name_, reinterpret_cast<const void*>(kernel_), grid_, block_, shared_, stream_,
                  [kernel, params] { std::apply(kernel, *params); });
  }

 private:
  void (*kernel_)(P...);
  dim3 grid_, block_;
  size_t shared_;
  cudaStream_t stream_;
  const char* name_;
};

template <typename... P>
Launcher<P...> Launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared,
                      cudaStream_t stream, const char* name) {
  return Launcher<P...>(kernel, grid, block, shared, stream, name);
}

}  // namespace sluice::emu

template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*func)(P...), cudaFuncAttribute attr, int value) {
  return ::sluice::emu::SetFunctionAttribute(reinterpret_cast<const void*>(func), attr, value);
}

template <typename... P>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, void (*func)(P...),
                                                          int block_threads,
                                                          size_t dynamic_shared) {
  (void)func;
  return ::sluice::emu::OccupancyBlocksPerSm(blocks, block_threads, dynamic_shared);
}

#endif  // SLUICE_KERNELS_CUDA_EMU_RUNTIME_H_
