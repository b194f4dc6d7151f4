// The device side of the CUDA emulation: what a kernel sees. Every CUDA thread of a block runs
// as a fiber; the built-in indices, barriers, warp collectives, shared memory, asynchronous
// copies and atomics below are implemented against the block scheduler (scheduler.cc), so that
// the project's .cu files compile unchanged with g++ and run on the CPU under ASan, UBSan or
// TSan. It catches indexing, barrier and async-copy bugs; it says nothing about speed.
//
// Semantics chosen to expose bugs rather than hide them:
// - threads of a block run until they block (barrier, warp collective, exit), in forward,
//   reverse or random order, so a missing __syncthreads lets one thread read what another has
//   not written yet;
// - shared memory (static and dynamic) is fresh per block, filled with 0xff bytes (a NaN as
//   fp32/fp16/bf16, -1 as an integer) and bounded exactly (ASan);
// - __pipeline_memcpy_async lands only at the __pipeline_wait_prior that covers its group;
// - a barrier reached at different lines by threads of one block, a warp collective whose
//   mask names an exited lane, and a deadlock stop the process with a diagnostic;
// - cub::BlockReduce's result is poison outside thread 0, as CUB documents it undefined.
#ifndef SLUICE_KERNELS_CUDA_EMU_DEVICE_H_
#define SLUICE_KERNELS_CUDA_EMU_DEVICE_H_

#include <math.h>  // expf, fmaxf, ... in the global namespace, as device code sees them

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define SLUICE_CUDA_EMU 1

// Execution-space and declaration qualifiers have no meaning on the host.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ static
// Shared memory is declared with SLUICE_SHARED / SLUICE_DYNAMIC_SHARED (kernels/cuda/launch.cuh)
// so that the emulation can give every block its own, poisoned copy.
#define __shared__ \
  _Pragma("GCC error \"declare shared memory with SLUICE_SHARED or SLUICE_DYNAMIC_SHARED\"")

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}  // NOLINT: implicit, as in CUDA
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

struct alignas(8) int2 {
  int x, y;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

constexpr int warpSize = 32;

// CUDA declares these classification functions in the global namespace.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

namespace sluice::emu {

// What a CUDA thread knows about itself.
struct ThreadIndex {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

// The running CUDA thread's indices; stops the process when called outside a kernel.
const ThreadIndex& Self();

// Waits at a block barrier; `file`:`line` names the call site (all threads must agree).
void SyncThreads(const char* file, int line);
// Block barrier with a reduction of `predicate` over the block: count, and, or.
enum class BlockReduceOp { kCount, kAnd, kOr };
int SyncThreadsReduce(int predicate, BlockReduceOp op, const char* file, int line);

enum class WarpOp { kSync, kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kMma };
// A warp collective over the lanes in `mask`; returns the lane's result bits (the shuffled
// value, or the ballot / any / all).
uint64_t WarpCollective(unsigned mask, WarpOp op, uint64_t value, int arg, int width,
                        const char* file, int line);
// Lanes of the calling thread's warp that have not exited.
unsigned ActiveMask();
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 with d as C and D: the whole warp meets
// here, each lane with its fragments in PTX's layout (a: four f16x2 of A, row-major 16 x 16;
// b: two f16x2 of B, 16 x 8; d: four f32 of C, then D). Products and sums in fp32.
void MmaM16N8K16(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&d)[4], const char* file,
                 int line);

// This block's copy of the shared variable declared at `tag` (one per declaration), `bytes`
// long, poisoned on first use in the block.
void* BlockSharedBytes(const void* tag, size_t bytes, size_t align);
// The launch's dynamic shared memory (exactly the requested bytes; poisoned).
void* DynamicSharedBytes();

// cp.async through the pipeline primitives.
void PipelineCopy(void* dst, const void* src, size_t bytes, size_t zero_fill, const char* file,
                  int line);
void PipelineCommit();
void PipelineWaitPrior(size_t groups);

template <typename T>
T& BlockShared(const void* tag) {
  return *static_cast<T*>(BlockSharedBytes(tag, sizeof(T), alignof(T)));
}
template <typename T>
T* DynamicShared() {
  return static_cast<T*>(DynamicSharedBytes());
}

template <typename T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp shuffle of this type");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

// Atomics on device memory, as read-modify-write on the host (visible to TSan as atomics).
template <typename T, typename F>
T AtomicUpdate(T* addr, F f) {
  std::atomic_ref<T> a(*addr);
  T old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, f(old), std::memory_order_relaxed)) {
  }
  return old;
}

}  // namespace sluice::emu

#define threadIdx (::sluice::emu::Self().thread_idx)
#define blockIdx (::sluice::emu::Self().block_idx)
#define blockDim (::sluice::emu::Self().block_dim)
#define gridDim (::sluice::emu::Self().grid_dim)

#define __syncthreads() ::sluice::emu::SyncThreads(__FILE__, __LINE__)
#define __syncthreads_count(p) \
  ::sluice::emu::SyncThreadsReduce((p), ::sluice::emu::BlockReduceOp::kCount, __FILE__, __LINE__)
#define __syncthreads_and(p) \
  ::sluice::emu::SyncThreadsReduce((p), ::sluice::emu::BlockReduceOp::kAnd, __FILE__, __LINE__)
#define __syncthreads_or(p) \
  ::sluice::emu::SyncThreadsReduce((p), ::sluice::emu::BlockReduceOp::kOr, __FILE__, __LINE__)

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::sluice::emu::WarpCollective(mask, ::sluice::emu::WarpOp::kSync, 0, 0, 32, __FILE__, __LINE__);
}
inline unsigned __activemask() { return ::sluice::emu::ActiveMask(); }
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(::sluice::emu::WarpCollective(
      mask, ::sluice::emu::WarpOp::kBallot, predicate != 0, 0, 32, __FILE__, __LINE__));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(::sluice::emu::WarpCollective(mask, ::sluice::emu::WarpOp::kAny,
                                                        predicate != 0, 0, 32, __FILE__, __LINE__));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(::sluice::emu::WarpCollective(mask, ::sluice::emu::WarpOp::kAll,
                                                        predicate != 0, 0, 32, __FILE__, __LINE__));
}
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return ::sluice::emu::FromBits<T>(::sluice::emu::WarpCollective(
      mask, ::sluice::emu::WarpOp::kShflIdx, ::sluice::emu::ToBits(var), src_lane, width, __FILE__,
      __LINE__));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ::sluice::emu::FromBits<T>(::sluice::emu::WarpCollective(
      mask, ::sluice::emu::WarpOp::kShflUp, ::sluice::emu::ToBits(var), static_cast<int>(delta),
      width, __FILE__, __LINE__));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ::sluice::emu::FromBits<T>(::sluice::emu::WarpCollective(
      mask, ::sluice::emu::WarpOp::kShflDown, ::sluice::emu::ToBits(var), static_cast<int>(delta),
      width, __FILE__, __LINE__));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return ::sluice::emu::FromBits<T>(::sluice::emu::WarpCollective(
      mask, ::sluice::emu::WarpOp::kShflXor, ::sluice::emu::ToBits(var), lane_mask, width, __FILE__,
      __LINE__));
}

// Memory fences: the fibers of one process share memory coherently.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Atomics.
template <typename T>
T atomicAdd(T* addr, T v) {
  return ::sluice::emu::AtomicUpdate(addr, [v](T old) { return static_cast<T>(old + v); });
}
template <typename T>
T atomicSub(T* addr, T v) {
  return ::sluice::emu::AtomicUpdate(addr, [v](T old) { return static_cast<T>(old - v); });
}
template <typename T>
T atomicMin(T* addr, T v) {
  return ::sluice::emu::AtomicUpdate(addr, [v](T old) { return v < old ? v : old; });
}
template <typename T>
T atomicMax(T* addr, T v) {
  return ::sluice::emu::AtomicUpdate(addr, [v](T old) { return v > old ? v : old; });
}
template <typename T>
T atomicAnd(T* addr, T v) {
  return ::sluice::emu::AtomicUpdate(addr, [v](T old) { return static_cast<T>(old & v); });
}
template <typename T>
T atomicOr(T* addr, T v) {
  return ::sluice::emu::AtomicUpdate(addr, [v](T old) { return static_cast<T>(old | v); });
}
template <typename T>
T atomicXor(T* addr, T v) {
  return ::sluice::emu::AtomicUpdate(addr, [v](T old) { return static_cast<T>(old ^ v); });
}
template <typename T>
T atomicExch(T* addr, T v) {
  return ::sluice::emu::AtomicUpdate(addr, [v](T) { return v; });
}
template <typename T>
T atomicCAS(T* addr, T compare, T v) {
  return ::sluice::emu::AtomicUpdate(addr,
                                     [compare, v](T old) { return old == compare ? v : old; });
}
// atomicInc/atomicDec with CUDA's wrap-around.
inline unsigned atomicInc(unsigned* addr, unsigned limit) {
  return ::sluice::emu::AtomicUpdate(addr,
                                     [limit](unsigned old) { return old >= limit ? 0 : old + 1; });
}

// Asynchronous copies (cuda_pipeline.h's primitives).
inline void __pipeline_memcpy_async(void* dst, const void* src, size_t size_and_align,
                                    size_t zfill = 0) {
  ::sluice::emu::PipelineCopy(dst, src, size_and_align, zfill, __FILE__, __LINE__);
}
inline void __pipeline_commit() { ::sluice::emu::PipelineCommit(); }
inline void __pipeline_wait_prior(size_t prior) { ::sluice::emu::PipelineWaitPrior(prior); }

// Loads through the read-only cache.
template <typename T>
T __ldg(const T* p) {
  return *p;
}

// Integer and bit intrinsics.
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
// Byte s of the 8 bytes {y, x} (x the low 4) for each selector nibble of the result's 4 bytes.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t bytes = (uint64_t{y} << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<unsigned>((bytes >> (((s >> (4 * i)) & 7) * 8)) & 0xff) << (8 * i);
  return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned s = shift & 31;
  const uint64_t v = (uint64_t{hi} << 32) | lo;
  return static_cast<unsigned>(v >> s);
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned s = shift & 31;
  const uint64_t v = (uint64_t{hi} << 32) | lo;
  return static_cast<unsigned>((v << s) >> 32);
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((uint64_t{a} * b) >> 32);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }

// Single-precision arithmetic with explicit round-to-nearest (IEEE on the host too).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : (x == x ? x : 0.f)); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float exp10f(float x) { return std::pow(10.f, x); }
inline void sincosf(float x, float* s, float* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
// sin(pi x) and cos(pi x), x first reduced to [-1, 1] exactly (as CUDA's sincospi).
inline void sincospi(double x, double* s, double* c) {
  const double r = x - 2.0 * std::nearbyint(x * 0.5);
  *s = std::sin(3.14159265358979323846 * r);
  *c = std::cos(3.14159265358979323846 * r);
}

// CUDA's global min/max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

#endif  // SLUICE_KERNELS_CUDA_EMU_DEVICE_H_
