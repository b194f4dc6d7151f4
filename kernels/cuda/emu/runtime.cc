#include "kernels/cuda/emu/runtime.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cuda/emu/fiber.h"
#include "kernels/cuda/emu/scheduler.h"

struct CUstream_st {
  unsigned flags;
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;  // in issue order
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};
struct CUevent_st {
  unsigned flags;
  bool recorded = false;  // a record is queued or done
  bool done = false;      // the record has executed
  std::chrono::steady_clock::time_point at;
};

namespace sluice::emu {
namespace {

// The emulated device, shaped like an H100 SXM.
constexpr int kSms = 132;
constexpr size_t kDefaultSharedPerBlock = 48 * 1024;
constexpr size_t kOptinSharedPerBlock = 232448;  // 227 KiB
constexpr size_t kSharedPerSm = 233472;
constexpr size_t kReservedSharedPerBlock = 1024;
constexpr int kMaxThreadsPerSm = 2048;
constexpr int kMaxBlocksPerSm = 32;
constexpr size_t kGlobalBytes = size_t{80} << 30;
constexpr size_t kAlignment = 256;  // cudaMalloc's

struct Allocation {
  size_t bytes;
  bool device;             // false: page-locked host memory (cudaMallocHost)
  size_t pages_bytes = 0;  // device: the whole pages it takes, closed to host code (DeviceAccess)
};

struct State {
  std::recursive_mutex mu;
  // Keyed by ~address: ordered (descending addresses) for range lookups, and not a pointer, so
  // LeakSanitizer still reports device memory nobody frees.
  std::map<uintptr_t, Allocation> allocations;
  std::deque<std::function<void()>> queue;
  // The active stream capture, if any (one at a time: the project captures on one stream).
  struct Capture {
    cudaStream_t stream = nullptr;
    std::vector<std::function<void()>> ops;
    bool invalidated = false;
  };
  std::optional<Capture> capture;
  std::unordered_map<const void*, int> max_dynamic_shared;
  cudaError_t last_error = cudaSuccess;
  int device = 0;
  RuntimeCounters counters;
  int device_access = 0;  // DeviceAccess scopes open
};

State& S() {
  static auto* s = new State();
  return *s;
}

void Say(const std::string& what) { std::fprintf(stderr, "sluice emu: %s\n", what.c_str()); }

cudaError_t Fail(cudaError_t e, const std::string& why) {
  Say(why);
  return e;
}

// Device memory is closed to host code, as a GPU's is: every device allocation takes whole
// pages of its own, mapped without access (and poisoned for AddressSanitizer) while host code
// runs, so host code that dereferences a device pointer, instrumented or not, stops at the
// access (SIGSEGV, or an ASan report naming the line). The runtime opens it (a DeviceAccess
// scope) only while it does device work: queued ops, blocking copies and memsets.
void SetDeviceAccess(State& s, bool open) {
  for (const auto& [key, a] : s.allocations) {
    if (!a.device) continue;
    void* base = reinterpret_cast<void*>(~key);
    mprotect(base, a.pages_bytes, open ? PROT_READ | PROT_WRITE : PROT_NONE);
    open ? AsanUnpoison(base, a.bytes) : AsanPoison(base, a.bytes);
  }
}

class DeviceAccess {
 public:
  DeviceAccess() : lock_(S().mu) {
    if (S().device_access++ == 0) SetDeviceAccess(S(), true);
  }
  ~DeviceAccess() {
    if (--S().device_access == 0) SetDeviceAccess(S(), false);
  }

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

// Runs everything queued, in order.
void Drain() {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (s.queue.empty()) return;
  DeviceAccess access;
  while (!s.queue.empty()) {
    std::function<void()> op = std::move(s.queue.front());
    s.queue.pop_front();
    op();
  }
}

// Queues `op`, or records it when `stream` is capturing.
void Enqueue(std::function<void()> op, cudaStream_t stream) {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (s.capture && s.capture->stream == stream) {
    s.capture->ops.push_back(std::move(op));
  } else {
    s.queue.push_back(std::move(op));
  }
}

// True, after invalidating the capture and saying why, when a capture is active: `api` waits
// for the device or allocates, which a capture forbids.
bool RefusedWhileCapturing(const char* api) {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (!s.capture) return false;
  s.capture->invalidated = true;
  s.last_error = cudaErrorStreamCaptureUnsupported;
  Say(
      absl::StrFormat("%s while a stream capture is active: not allowed (it waits for the device "
                      "or allocates); the capture is invalidated",
                      api));
  return true;
}

// The allocation holding [p, p + bytes), if one does.
const Allocation* Find(const void* p, size_t bytes, uintptr_t* base_out = nullptr) {
  State& s = S();
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = s.allocations.lower_bound(~a);  // the highest base <= a
  if (it == s.allocations.end()) return nullptr;
  const uintptr_t base = ~it->first;
  if (a < base || a + bytes > base + it->second.bytes) return nullptr;
  if (base_out != nullptr) *base_out = base;
  return &it->second;
}

bool IsDevice(const void* p) {
  const Allocation* a = Find(p, 1);  // one past the end of an allocation is not in it
  return a != nullptr && a->device;
}

void CountBlocking() {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  ++s.counters.blocking_calls;
}

cudaError_t Allocate(void** ptr, size_t bytes, bool device) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue, "cudaMalloc with a null result pointer");
  {
    State& s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    ++(device ? s.counters.device_allocations : s.counters.host_allocations);
  }
  // Device memory: whole pages (DeviceAccess closes them), the slack past `bytes` poisoned so
  // that ASan still bounds the allocation exactly.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t pages_bytes = device ? (std::max<size_t>(bytes, 1) + page - 1) / page * page : 0;
  void* p = nullptr;
  if (posix_memalign(&p, device ? page : kAlignment,
                     device ? pages_bytes : std::max<size_t>(bytes, 1)) != 0) {
    *ptr = nullptr;
    return cudaErrorMemoryAllocation;
  }
  std::memset(p, 0xff, bytes);  // uninitialized memory reads as NaN or -1
  if (device) AsanPoison(static_cast<uint8_t*>(p) + bytes, pages_bytes - bytes);
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  s.allocations[~reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, device, pages_bytes};
  if (device && s.device_access == 0) {
    mprotect(p, pages_bytes, PROT_NONE);
    AsanPoison(p, bytes);
  }
  *ptr = p;
  return cudaSuccess;
}

cudaError_t Release(void* ptr, bool device, const char* api) {
  if (ptr == nullptr) return cudaSuccess;
  if (device) {
    State& s = S();
    std::lock_guard<std::recursive_mutex> lock(s.mu);
    ++s.counters.device_frees;
  }
  Drain();  // cudaFree waits for the device
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  auto it = s.allocations.find(~reinterpret_cast<uintptr_t>(ptr));
  if (it == s.allocations.end() || it->second.device != device) {
    return Fail(cudaErrorInvalidValue,
                absl::StrFormat("%s(%p): not the start of a live %s allocation (double free?)", api,
                                ptr, device ? "cudaMalloc" : "cudaMallocHost"));
  }
  if (device) {
    mprotect(ptr, it->second.pages_bytes, PROT_READ | PROT_WRITE);
    AsanUnpoison(ptr, it->second.pages_bytes);
  }
  s.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

std::string CopyName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "host-to-host";
    case cudaMemcpyHostToDevice:
      return "host-to-device";
    case cudaMemcpyDeviceToHost:
      return "device-to-host";
    case cudaMemcpyDeviceToDevice:
      return "device-to-device";
    case cudaMemcpyDefault:
      return "default";
  }
  return "unknown";
}

// Checks a copy's pointers against its kind; on success *kind is the resolved kind.
cudaError_t CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind* kind,
                      const char* api) {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (*kind == cudaMemcpyDefault) {
    const bool d = IsDevice(dst), sr = IsDevice(src);
    *kind = d ? (sr ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
              : (sr ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool dst_device = *kind == cudaMemcpyHostToDevice || *kind == cudaMemcpyDeviceToDevice;
  const bool src_device = *kind == cudaMemcpyDeviceToHost || *kind == cudaMemcpyDeviceToDevice;
  if (*kind < cudaMemcpyHostToHost || *kind > cudaMemcpyDeviceToDevice) {
    return Fail(cudaErrorInvalidMemcpyDirection, absl::StrFormat("%s: bad copy kind", api));
  }
  if (bytes == 0) return cudaSuccess;
  if (dst_device && !CheckDeviceRange(dst, bytes, api)) return cudaErrorInvalidValue;
  if (src_device && !CheckDeviceRange(src, bytes, api)) return cudaErrorInvalidValue;
  if (!dst_device && IsDevice(dst)) {
    return Fail(cudaErrorInvalidValue, absl::StrFormat("%s %s: the destination %p is device memory",
                                                       api, CopyName(*kind), dst));
  }
  if (!src_device && IsDevice(src)) {
    return Fail(cudaErrorInvalidValue, absl::StrFormat("%s %s: the source %p is device memory", api,
                                                       CopyName(*kind), src));
  }
  return cudaSuccess;
}

bool IsPinned(const void* p, size_t bytes) {
  const Allocation* a = Find(p, bytes);
  return a != nullptr && !a->device;
}

}  // namespace

RuntimeCounters Counters() {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return s.counters;
}

bool CheckDeviceRange(const void* p, size_t bytes, const char* what, bool pinned_ok) {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  uintptr_t base = 0;
  const Allocation* a = Find(p, bytes, &base);
  if (a != nullptr && (a->device || pinned_ok)) return true;
  const Allocation* start = Find(p, 1, &base);
  if (start != nullptr) {
    Say(absl::StrFormat("%s: [%p, +%d) runs past the end of the %d-byte allocation at 0x%x", what,
                        p, bytes, start->bytes, base));
  } else {
    Say(absl::StrFormat("%s: %p is not device memory (no live cudaMalloc holds it)", what, p));
  }
  return false;
}

cudaError_t SetFunctionAttribute(const void* func, cudaFuncAttribute attr, int value) {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > kOptinSharedPerBlock) {
      s.last_error = cudaErrorInvalidValue;
      return Fail(cudaErrorInvalidValue,
                  absl::StrFormat("cudaFuncSetAttribute: %d bytes of dynamic shared memory is "
                                  "over the device's %d",
                                  value, kOptinSharedPerBlock));
    }
    s.max_dynamic_shared[func] = value;
  }
  return cudaSuccess;
}

int MaxDynamicShared(const void* func) {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  auto it = s.max_dynamic_shared.find(func);
  return it == s.max_dynamic_shared.end() ? static_cast<int>(kDefaultSharedPerBlock) : it->second;
}

cudaError_t OccupancyBlocksPerSm(int* blocks, int block_threads, size_t dynamic_shared) {
  if (blocks == nullptr || block_threads <= 0 || block_threads > 1024) {
    return cudaErrorInvalidValue;
  }
  // Threads and shared memory only: registers are not known on the host.
  const int warps = (block_threads + 31) / 32;
  int n = std::min(kMaxBlocksPerSm, kMaxThreadsPerSm / (warps * 32));
  n = std::min<int>(n, kSharedPerSm / (dynamic_shared + kReservedSharedPerBlock));
  *blocks = n;
  return cudaSuccess;
}

void EnqueueLaunch(const char* name, const void* func, dim3 grid, dim3 block, size_t shared,
                   cudaStream_t stream, std::function<void()> body) {
  State& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  std::string bad;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535) {
    bad = absl::StrFormat("grid (%d,%d,%d) is empty or too large", grid.x, grid.y, grid.z);
  } else if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64) {
    bad = absl::StrFormat("block (%d,%d,%d) is empty or over 1024 threads", block.x, block.y,
                          block.z);
  }
  if (!bad.empty()) {
    s.last_error = cudaErrorInvalidConfiguration;
    Say(absl::StrFormat("launch of %s: %s", name, bad));
    return;
  }
  const int limit = MaxDynamicShared(func);
  if (shared > static_cast<size_t>(limit)) {
    s.last_error = cudaErrorInvalidValue;
    Say(absl::StrFormat(
        "launch of %s: %d bytes of dynamic shared memory over the kernel's limit of %d (raise it "
        "with cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))",
        name, shared, limit));
    return;
  }
  auto spec = std::make_shared<GridSpec>();
  spec->kernel = name;
  spec->grid = grid;
  spec->block = block;
  spec->dynamic_shared_bytes = shared;
  spec->body = std::move(body);
  Enqueue([spec] { RunGrid(*spec); }, stream);
}

void EnqueueDeviceWork(cudaStream_t stream, std::function<void()> work) {
  Enqueue(std::move(work), stream);
}

}  // namespace sluice::emu

using sluice::emu::CheckDeviceRange;
using sluice::emu::S;

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "sluice emulated device (sm_90 on the CPU)");
  prop->totalGlobalMem = sluice::emu::kGlobalBytes;
  prop->sharedMemPerBlock = sluice::emu::kDefaultSharedPerBlock;
  prop->sharedMemPerBlockOptin = sluice::emu::kOptinSharedPerBlock;
  prop->sharedMemPerMultiprocessor = sluice::emu::kSharedPerSm;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsPerMultiProcessor = sluice::emu::kMaxThreadsPerSm;
  prop->multiProcessorCount = sluice::emu::kSms;
  prop->major = 9;
  prop->minor = 0;
  prop->l2CacheSize = 50 << 20;
  prop->memoryBusWidth = 5120;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = p.maxThreadsPerBlock;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(p.sharedMemPerBlock);
      break;
    case cudaDevAttrWarpSize:
      *value = p.warpSize;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      break;
    case cudaDevAttrGlobalMemoryBusWidth:
      *value = p.memoryBusWidth;
      break;
    case cudaDevAttrL2CacheSize:
      *value = p.l2CacheSize;
      break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
      *value = p.maxThreadsPerMultiProcessor;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = p.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = p.minor;
      break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = static_cast<int>(p.sharedMemPerMultiprocessor);
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (sluice::emu::RefusedWhileCapturing("cudaDeviceSynchronize")) {
    return cudaErrorStreamCaptureUnsupported;
  }
  sluice::emu::CountBlocking();
  sluice::emu::Drain();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return cudaErrorInvalidValue;
  auto& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  size_t used = 0;
  for (const auto& [key, a] : s.allocations) {
    if (a.device) used += a.bytes;
  }
  *total_bytes = sluice::emu::kGlobalBytes;
  *free_bytes = *total_bytes - std::min(used, *total_bytes);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (sluice::emu::RefusedWhileCapturing("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
  return sluice::emu::Allocate(ptr, bytes, true);
}
cudaError_t cudaFree(void* ptr) {
  if (sluice::emu::RefusedWhileCapturing("cudaFree")) return cudaErrorStreamCaptureUnsupported;
  return sluice::emu::Release(ptr, true, "cudaFree");
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  return sluice::emu::Allocate(ptr, bytes, false);
}
cudaError_t cudaFreeHost(void* ptr) { return sluice::emu::Release(ptr, false, "cudaFreeHost"); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (sluice::emu::RefusedWhileCapturing("cudaMemcpy")) return cudaErrorStreamCaptureUnsupported;
  sluice::emu::CountBlocking();
  if (cudaError_t e = sluice::emu::CheckCopy(dst, src, bytes, &kind, "cudaMemcpy");
      e != cudaSuccess) {
    return e;
  }
  sluice::emu::Drain();
  sluice::emu::DeviceAccess access;
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (cudaError_t e = sluice::emu::CheckCopy(dst, src, bytes, &kind, "cudaMemcpyAsync");
      e != cudaSuccess) {
    return e;
  }
  if (bytes == 0) return cudaSuccess;
  const bool pageable = (kind == cudaMemcpyHostToDevice && !sluice::emu::IsPinned(src, bytes)) ||
                        (kind == cudaMemcpyDeviceToHost && !sluice::emu::IsPinned(dst, bytes));
  if (pageable && sluice::emu::RefusedWhileCapturing("cudaMemcpyAsync through pageable memory")) {
    return cudaErrorStreamCaptureUnsupported;
  }
  if (kind == cudaMemcpyHostToDevice && !sluice::emu::IsPinned(src, bytes)) {
    // Pageable source: CUDA stages it before returning, so the caller may reuse it at once.
    auto staged = std::make_shared<std::string>(static_cast<const char*>(src), bytes);
    sluice::emu::Enqueue([dst, staged] { std::memcpy(dst, staged->data(), staged->size()); },
                         stream);
    return cudaSuccess;
  }
  if (kind == cudaMemcpyDeviceToHost && !sluice::emu::IsPinned(dst, bytes)) {
    // Pageable destination: the copy completes before the call returns.
    sluice::emu::Drain();
    sluice::emu::DeviceAccess access;
    std::memcpy(dst, src, bytes);
    return cudaSuccess;
  }
  sluice::emu::Enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); }, stream);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (sluice::emu::RefusedWhileCapturing("cudaMemset")) return cudaErrorStreamCaptureUnsupported;
  sluice::emu::CountBlocking();
  if (bytes > 0 && !CheckDeviceRange(ptr, bytes, "cudaMemset")) return cudaErrorInvalidValue;
  sluice::emu::Drain();
  sluice::emu::DeviceAccess access;
  if (bytes > 0) std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (bytes > 0 && !CheckDeviceRange(ptr, bytes, "cudaMemsetAsync")) {
    return cudaErrorInvalidValue;
  }
  if (bytes > 0) {
    sluice::emu::Enqueue([ptr, value, bytes] { std::memset(ptr, value, bytes); }, stream);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  *stream = new CUstream_st{flags};
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return cudaErrorInvalidResourceHandle;
  if (sluice::emu::RefusedWhileCapturing("cudaStreamDestroy")) {
    return cudaErrorStreamCaptureUnsupported;
  }
  sluice::emu::Drain();
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (sluice::emu::RefusedWhileCapturing("cudaStreamSynchronize")) {
    return cudaErrorStreamCaptureUnsupported;
  }
  sluice::emu::CountBlocking();
  (void)stream;
  sluice::emu::Drain();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  (void)stream;
  (void)flags;
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  return cudaSuccess;  // one in-order queue: everything recorded before is already ahead
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (event == nullptr) return cudaErrorInvalidValue;
  *event = new CUevent_st{flags};
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  sluice::emu::Drain();  // a queued record must not outlive its event
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  event->recorded = true;
  event->done = false;
  sluice::emu::Enqueue(
      [event] {
        event->at = std::chrono::steady_clock::now();
        event->done = true;
      },
      stream);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (sluice::emu::RefusedWhileCapturing("cudaEventSynchronize")) {
    return cudaErrorStreamCaptureUnsupported;
  }
  sluice::emu::Drain();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  return !event->recorded || event->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return cudaErrorInvalidResourceHandle;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  if (!start->done || !end->done) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  (void)mode;
  auto& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (stream == nullptr) {
    return sluice::emu::Fail(cudaErrorStreamCaptureUnsupported,
                             "cudaStreamBeginCapture on the legacy default stream");
  }
  if (s.capture) {
    return sluice::emu::Fail(cudaErrorIllegalState,
                             "cudaStreamBeginCapture while another capture is active");
  }
  s.capture.emplace();
  s.capture->stream = stream;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  auto& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (graph == nullptr) return cudaErrorInvalidValue;
  *graph = nullptr;
  if (!s.capture || s.capture->stream != stream) {
    return sluice::emu::Fail(cudaErrorIllegalState,
                             "cudaStreamEndCapture on a stream that is not capturing");
  }
  auto capture = std::move(*s.capture);
  s.capture.reset();
  if (capture.invalidated) return cudaErrorStreamCaptureInvalidated;
  *graph = new CUgraph_st{std::move(capture.ops)};
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  auto& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (status == nullptr) return cudaErrorInvalidValue;
  *status = !s.capture || s.capture->stream != stream ? cudaStreamCaptureStatusNone
            : s.capture->invalidated                  ? cudaStreamCaptureStatusInvalidated
                                                      : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  (void)flags;
  if (exec == nullptr || graph == nullptr) return cudaErrorInvalidValue;
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return cudaErrorInvalidResourceHandle;
  // Copies: the executable graph stays launchable.
  for (const std::function<void()>& op : exec->ops) sluice::emu::Enqueue(op, stream);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return cudaErrorInvalidResourceHandle;
  delete exec;  // queued launches of it hold copies of its ops
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return cudaErrorInvalidResourceHandle;
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  auto& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  const cudaError_t e = s.last_error;
  s.last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  auto& s = S();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return s.last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    case cudaErrorDevicesUnavailable:
      return "cudaErrorDevicesUnavailable";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    default:
      return cudaGetErrorName(error);
  }
}
