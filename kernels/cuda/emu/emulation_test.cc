// The emulation of CUDA itself: what kernels compiled for it see (indices, barriers, warp
// collectives, shared memory, cp.async, atomics, CUB, cuBLAS), what the runtime checks, and that
// the bugs it exists for stop the process (death tests). Kernels here are tiny and written for
// the test; the project's kernels are checked by their own tests' _emu twins.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda/std/functional>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/emu/cublas.h"
#include "kernels/cuda/emu/fp_types.h"
#include "kernels/cuda/launch.cuh"

namespace {

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return p;
}

template <typename T>
std::vector<T> HostCopy(const T* p, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// ---- Indices ----

__global__ void WriteIndices(int* out) {
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = block * 1000 + thread;
}

TEST(Emulation, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const int n = 12 * 24;
  int* out = DeviceCopy(std::vector<int>(n, -1));
  SLUICE_LAUNCH(grid, block, 0, nullptr, WriteIndices)(out);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = HostCopy(out, n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[i], i / 24 * 1000 + i % 24) << i;
  cudaFree(out);
}

// ---- Barriers and shared memory ----

// Reverses `in` through shared memory: correct only with the barrier between write and read.
__global__ void ReverseThroughShared(const float* in, float* out) {
  SLUICE_SHARED(tile, float[128]);
  tile[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}

TEST(Emulation, BarrierOrdersSharedMemory) {
  std::vector<float> in(128);
  std::iota(in.begin(), in.end(), 0.f);
  float* din = DeviceCopy(in);
  float* dout = DeviceCopy(std::vector<float>(128, 0.f));
  SLUICE_LAUNCH(4, 128, 0, nullptr, ReverseThroughShared)(din, dout);
  const std::vector<float> got = HostCopy(dout, 128);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(got[i], 127 - i);
  cudaFree(din);
  cudaFree(dout);
}

__global__ void ReadSharedBeforeWriting(float* out) {
  SLUICE_SHARED(tile, float[32]);
  out[threadIdx.x] = tile[threadIdx.x];
}

__global__ void ReadDynamicShared(float* out) {
  SLUICE_DYNAMIC_SHARED(smem, float);
  out[threadIdx.x] = smem[threadIdx.x];
}

TEST(Emulation, FreshSharedMemoryIsPoison) {
  float* out = DeviceCopy(std::vector<float>(32, 0.f));
  SLUICE_LAUNCH(1, 32, 0, nullptr, ReadSharedBeforeWriting)(out);
  for (float x : HostCopy(out, 32)) EXPECT_TRUE(std::isnan(x));
  SLUICE_LAUNCH(1, 32, 32 * sizeof(float), nullptr, ReadDynamicShared)(out);
  for (float x : HostCopy(out, 32)) EXPECT_TRUE(std::isnan(x));
  cudaFree(out);
}

__global__ void CountBarrier(const int* in, int* out) {
  const int n = __syncthreads_count(in[threadIdx.x] > 0);
  const int all = __syncthreads_and(in[threadIdx.x] > 0);
  const int any = __syncthreads_or(in[threadIdx.x] > 0);
  if (threadIdx.x == 0) {
    out[0] = n;
    out[1] = all;
    out[2] = any;
  }
}

TEST(Emulation, BarrierReductions) {
  std::vector<int> in(64, 0);
  for (int i = 0; i < 64; i += 3) in[i] = 1;
  int* din = DeviceCopy(in);
  int* dout = DeviceCopy(std::vector<int>(3, -1));
  SLUICE_LAUNCH(1, 64, 0, nullptr, CountBarrier)(din, dout);
  EXPECT_EQ(HostCopy(dout, 3), (std::vector<int>{22, 0, 1}));
  cudaFree(din);
  cudaFree(dout);
}

// ---- Warp collectives ----

__global__ void Shuffles(int* out) {
  const int lane = threadIdx.x % 32;
  const int base = threadIdx.x * 6;
  out[base + 0] = __shfl_sync(0xffffffffu, lane * 10, 3);
  out[base + 1] = __shfl_xor_sync(0xffffffffu, lane, 1);
  out[base + 2] = __shfl_down_sync(0xffffffffu, lane, 4);
  out[base + 3] = __shfl_up_sync(0xffffffffu, lane, 2, 8);
  out[base + 4] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 2 == 0));
  out[base + 5] = __all_sync(0xffffffffu, lane < 40) + 2 * __any_sync(0xffffffffu, lane == 7);
}

TEST(Emulation, WarpShufflesAndVotes) {
  int* out = DeviceCopy(std::vector<int>(64 * 6, -1));
  SLUICE_LAUNCH(1, 64, 0, nullptr, Shuffles)(out);
  const std::vector<int> got = HostCopy(out, 64 * 6);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    SCOPED_TRACE(t);
    EXPECT_EQ(got[t * 6 + 0], 30);
    EXPECT_EQ(got[t * 6 + 1], lane ^ 1);
    EXPECT_EQ(got[t * 6 + 2], lane + 4 < 32 ? lane + 4 : lane);
    EXPECT_EQ(got[t * 6 + 3], lane % 8 >= 2 ? lane - 2 : lane);
    EXPECT_EQ(static_cast<unsigned>(got[t * 6 + 4]), 0x55555555u);
    EXPECT_EQ(got[t * 6 + 5], 3);
  }
  cudaFree(out);
}

__global__ void WarpSumFloat(float* out) {
  float x = static_cast<float>(threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  out[threadIdx.x] = x;
}

TEST(Emulation, ButterflyReduction) {
  float* out = DeviceCopy(std::vector<float>(32, 0.f));
  SLUICE_LAUNCH(1, 32, 0, nullptr, WarpSumFloat)(out);
  for (float x : HostCopy(out, 32)) EXPECT_EQ(x, 496.f);
  cudaFree(out);
}

// ---- Asynchronous copies ----

__global__ void CopyThroughPipeline(const float4* in, float4* out, bool wait) {
  SLUICE_DYNAMIC_SHARED(smem, float4);
  __pipeline_memcpy_async(&smem[threadIdx.x], &in[threadIdx.x], 16);
  __pipeline_commit();
  if (wait) __pipeline_wait_prior(0);
  __syncthreads();
  out[threadIdx.x] = smem[(threadIdx.x + 1) % blockDim.x];
}

TEST(Emulation, AsyncCopiesLandAtTheirWait) {
  std::vector<float4> in(32);
  for (int i = 0; i < 32; ++i) in[i] = {float(i), float(i), float(i), float(i)};
  float4* din = DeviceCopy(in);
  float4* dout = DeviceCopy(std::vector<float4>(32));
  SLUICE_LAUNCH(1, 32, 32 * sizeof(float4), nullptr, CopyThroughPipeline)(din, dout, true);
  std::vector<float4> got = HostCopy(dout, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(got[i].x, (i + 1) % 32);
  // Without the wait, the copies never land: the block reads poison.
  SLUICE_LAUNCH(1, 32, 32 * sizeof(float4), nullptr, CopyThroughPipeline)(din, dout, false);
  got = HostCopy(dout, 32);
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(got[i].x));
  cudaFree(din);
  cudaFree(dout);
}

// ---- Atomics ----

__global__ void Atomics(unsigned* counter, float* sum, unsigned long long* bits, int* lo) {
  atomicAdd(counter, 1u);
  atomicAdd(sum, 0.5f);
  atomicOr(bits, 1ull << (threadIdx.x % 64));
  atomicMin(lo, static_cast<int>(blockIdx.x * 100 + threadIdx.x) - 50);
}

TEST(Emulation, AtomicsCountEveryThread) {
  unsigned* counter = DeviceCopy(std::vector<unsigned>{0});
  float* sum = DeviceCopy(std::vector<float>{0.f});
  unsigned long long* bits = DeviceCopy(std::vector<unsigned long long>{0});
  int* lo = DeviceCopy(std::vector<int>{1 << 30});
  SLUICE_LAUNCH(5, 96, 0, nullptr, Atomics)(counter, sum, bits, lo);
  EXPECT_EQ(HostCopy(counter, 1)[0], 480u);
  EXPECT_EQ(HostCopy(sum, 1)[0], 240.f);
  EXPECT_EQ(HostCopy(bits, 1)[0], ~0ull);
  EXPECT_EQ(HostCopy(lo, 1)[0], -50);
  cudaFree(counter);
  cudaFree(sum);
  cudaFree(bits);
  cudaFree(lo);
}

// ---- CUB ----

__global__ void ScanAndReduce(const int* in, int* out) {
  using Scan = cub::BlockScan<int, 128>;
  using Reduce = cub::BlockReduce<int, 128>;
  SLUICE_SHARED(scan, Scan::TempStorage);
  SLUICE_SHARED(reduce, Reduce::TempStorage);
  int prefix = 0, total = 0;
  Scan(scan).ExclusiveSum(in[threadIdx.x], prefix, total);
  const int sum = Reduce(reduce).Sum(in[threadIdx.x]);
  out[threadIdx.x] = prefix;
  if (threadIdx.x == 0) out[128] = sum * 1000 + total;
}

TEST(Emulation, CubBlockScanAndReduce) {
  std::vector<int> in(128);
  for (int i = 0; i < 128; ++i) in[i] = i % 7;
  int* din = DeviceCopy(in);
  int* dout = DeviceCopy(std::vector<int>(129, -1));
  SLUICE_LAUNCH(1, 128, 0, nullptr, ScanAndReduce)(din, dout);
  const std::vector<int> got = HostCopy(dout, 129);
  int acc = 0;
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(got[i], acc);
    acc += in[i];
  }
  EXPECT_EQ(got[128], acc * 1000 + acc);
  cudaFree(din);
  cudaFree(dout);
}

TEST(Emulation, CubDeviceScanAsksForAndChecksStorage) {
  const std::vector<int32_t> in = {5, 1, 2, 3};
  int32_t* din = DeviceCopy(in);
  int64_t* dout = DeviceCopy(std::vector<int64_t>(4, -1));
  size_t bytes = 0;
  ASSERT_EQ(cub::DeviceScan::ExclusiveScan(nullptr, bytes, din, dout, ::cuda::std::plus<>{},
                                           int64_t{10}, 4),
            cudaSuccess);
  ASSERT_GT(bytes, 0u);
  void* temp = nullptr;
  ASSERT_EQ(cudaMalloc(&temp, bytes), cudaSuccess);
  size_t too_small = bytes - 1;
  EXPECT_EQ(cub::DeviceScan::ExclusiveScan(temp, too_small, din, dout, ::cuda::std::plus<>{},
                                           int64_t{10}, 4),
            cudaErrorInvalidValue);
  ASSERT_EQ(
      cub::DeviceScan::ExclusiveScan(temp, bytes, din, dout, ::cuda::std::plus<>{}, int64_t{10}, 4),
      cudaSuccess);
  EXPECT_EQ(HostCopy(dout, 4), (std::vector<int64_t>{10, 15, 16, 18}));
  cudaFree(temp);
  cudaFree(din);
  cudaFree(dout);
}

// ---- cuBLAS ----

TEST(Emulation, CublasSgemmIsColumnMajor) {
  // C (2x2) = A^T (2x3 as the transpose of a 3x2) * B (3x2), all column-major.
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // 3x2: columns (1,2,3), (4,5,6)
  const std::vector<float> b = {1, 0, 1, 0, 1, 0};  // 3x2: columns (1,0,1), (0,1,0)
  float* da = DeviceCopy(a);
  float* db = DeviceCopy(b);
  float* dc = DeviceCopy(std::vector<float>(4, NAN));  // beta = 0: C is not read
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const float one = 1.f, zero = 0.f;
  ASSERT_EQ(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, da, 3, db, 3, &zero, dc, 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(HostCopy(dc, 4), (std::vector<float>{4, 10, 2, 5}));
  EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, da, 1, db, 3, &zero, dc, 2),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasDestroy(h);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

// ---- The runtime ----

__global__ void AddOne(float* x) { x[threadIdx.x] += 1.f; }

TEST(Emulation, AsyncWorkWaitsForASynchronization) {
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(float)), cudaSuccess);
  for (int i = 0; i < 32; ++i) pinned[i] = 1.f;
  float* d = DeviceCopy(std::vector<float>(32, 5.f));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  SLUICE_LAUNCH(1, 32, 0, s, AddOne)(d);
  ASSERT_EQ(cudaMemcpyAsync(pinned, d, 32 * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(pinned[0], 1.f);  // nothing has run yet
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(pinned[0], 6.f);
  cudaStreamDestroy(s);
  cudaFreeHost(pinned);
  cudaFree(d);
}

// ---- Stream capture and graphs ----

// A capture records launches and copies without running them; each launch of the graph runs them
// again, on what the buffers hold then; a blocking call during a capture fails and invalidates it.
TEST(Emulation, CapturedWorkRunsAtEachGraphLaunch) {
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(float)), cudaSuccess);
  float* d = DeviceCopy(std::vector<float>(32, 5.f));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  SLUICE_LAUNCH(1, 32, 0, s, AddOne)(d);
  SLUICE_LAUNCH(1, 32, 0, s, AddOne)(d);
  ASSERT_EQ(cudaMemcpyAsync(pinned, d, 32 * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(HostCopy(d, 32)[0], 5.f);  // recorded, not run
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  for (float want : {7.f, 9.f, 11.f}) {
    pinned[0] = -1.f;
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    EXPECT_EQ(pinned[0], -1.f);  // queued until a synchronization
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(pinned[0], want);
  }
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);

  // A synchronization, an allocation or a copy through pageable memory while capturing: refused,
  // and the capture ends without a graph.
  std::vector<float> pageable(32);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaErrorIllegalState);
  SLUICE_LAUNCH(1, 32, 0, s, AddOne)(d);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  void* more = nullptr;
  EXPECT_EQ(cudaMalloc(&more, 64), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaMemcpyAsync(d, pageable.data(), 32 * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  cudaGetLastError();
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorIllegalState);
  EXPECT_EQ(HostCopy(d, 32)[0], 11.f);  // the refused capture's launch never ran
  cudaStreamDestroy(s);
  cudaFreeHost(pinned);
  cudaFree(d);
}

#if defined(__SANITIZE_ADDRESS__)
// Host code that reads device memory: on a GPU a fault or garbage; under ASan, a report at the
// read. Device work (kernels, copies) still reads and writes it.
TEST(EmulationDeathTest, HostCodeReadingDeviceMemoryIsReported) {
  float* d = DeviceCopy(std::vector<float>(8, 2.f));
  SLUICE_LAUNCH(1, 8, 0, nullptr, AddOne)(d);
  EXPECT_EQ(HostCopy(d, 8)[3], 3.f);
  EXPECT_DEATH(
      {
        const volatile float* p = d;
        std::printf("%f\n", p[3]);
      },
      "use-after-poison");
  cudaFree(d);
}
#endif

TEST(Emulation, RuntimeRejectsBadPointersAndLaunches) {
  float* d = DeviceCopy(std::vector<float>(8, 0.f));
  std::vector<float> host(16);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);  // runs past the allocation
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 8, 4, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);  // the source is not device memory
  EXPECT_EQ(cudaMemset(host.data(), 0, 4), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  SLUICE_LAUNCH(1, 2048, 0, nullptr, AddOne)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);          // read and cleared
  SLUICE_LAUNCH(1, 8, 64 * 1024, nullptr, AddOne)(d);  // over 48 KiB without opting in
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(AddOne, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
            cudaSuccess);
  SLUICE_LAUNCH(1, 8, 64 * 1024, nullptr, AddOne)(d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue);  // twice
}

TEST(Emulation, Fp16Bf16Fp8ConversionsRoundToNearestEven) {
  EXPECT_EQ(__half_as_ushort(__float2half_rn(1.f)), 0x3c00);
  EXPECT_EQ(__half_as_ushort(__float2half_rn(65504.f)), 0x7bff);
  EXPECT_EQ(__half_as_ushort(__float2half_rn(65520.f)), 0x7c00);           // rounds up to inf
  EXPECT_EQ(__half_as_ushort(__float2half_rn(1.f + 1.f / 2048)), 0x3c00);  // tie to even
  EXPECT_EQ(__half_as_ushort(__float2half_rn(std::ldexp(1.f, -24))), 0x0001);
  EXPECT_EQ(__half_as_ushort(__float2half_rn(std::ldexp(1.f, -25))), 0x0000);  // tie to even
  EXPECT_EQ(__half2float(__ushort_as_half(0x0001)), std::ldexp(1.f, -24));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half round-trips
    ASSERT_EQ(__half_as_ushort(__float2half_rn(__half2float(__ushort_as_half(h)))), h) << h;
  }
  EXPECT_EQ(__float2bfloat16_rn(1.00390625f).__x, 0x3f80);  // tie to even
  EXPECT_EQ(__float2bfloat16_rn(1.01171875f).__x, 0x3f82);
  EXPECT_EQ(__nv_cvt_float_to_fp8(448.f, __NV_SATFINITE, __NV_E4M3), 0x7e);
  EXPECT_EQ(__nv_cvt_float_to_fp8(1000.f, __NV_SATFINITE, __NV_E4M3), 0x7e);
  EXPECT_EQ(__nv_cvt_float_to_fp8(-1.f, __NV_SATFINITE, __NV_E4M3), 0xb8);
  EXPECT_EQ(__nv_cvt_float_to_fp8(std::ldexp(1.f, -9), __NV_SATFINITE, __NV_E4M3), 0x01);
  for (int b = 0; b < 256; ++b) {  // every e4m3 value but NaN round-trips through half
    if ((b & 0x7f) == 0x7f) continue;
    const float x = __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
    ASSERT_EQ(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), b) << b;
  }
}

// ---- Bugs stop the process ----

__global__ void DivergentBarrier(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void ShuffleWithExitedLane(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

// Half a warp waits for the other half at a shuffle; the other half waits at the barrier.
__global__ void BarrierInsideWarpCollective(int* out) {
  if (threadIdx.x < 16) {
    out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
  } else {
    __syncthreads();
  }
}

__global__ void OutOfBoundsShared(int* out) {
  SLUICE_DYNAMIC_SHARED(smem, int);
  smem[threadIdx.x] = 1;  // one int per thread, but only 16 bytes were asked for
  out[threadIdx.x] = smem[threadIdx.x];
}

__global__ void CopyToGlobal(float4* out, const float4* in) {
  __pipeline_memcpy_async(out + threadIdx.x, in + threadIdx.x, 16);
}

template <typename Kernel>
void RunBroken(Kernel kernel, int threads, size_t shared) {
  int* out = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&out), 64 * sizeof(float4));
  SLUICE_LAUNCH(1, threads, shared, nullptr, kernel)(out);
  cudaDeviceSynchronize();
}

using EmulationDeathTest = ::testing::Test;

TEST(EmulationDeathTest, BugsStopTheProcessWithADiagnostic) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(RunBroken(DivergentBarrier, 32, 0), "different barriers");
  EXPECT_DEATH(RunBroken(ShuffleWithExitedLane, 32, 0), "lane 5 .* which has exited");
  EXPECT_DEATH(RunBroken(BarrierInsideWarpCollective, 32, 0), "deadlock");
  EXPECT_DEATH(
      {
        float4* p = nullptr;
        cudaMalloc(reinterpret_cast<void**>(&p), 32 * sizeof(float4));
        SLUICE_LAUNCH(1, 8, 0, nullptr, CopyToGlobal)(p, p + 8);
        cudaDeviceSynchronize();
      },
      "not this block's shared memory");
#ifdef __SANITIZE_ADDRESS__
  EXPECT_DEATH(RunBroken(OutOfBoundsShared, 32, 16), "heap-buffer-overflow");
#endif
}

#ifdef __SANITIZE_THREAD__
// Shared memory written and read by different threads with no barrier between: a race.
__global__ void ReverseWithoutBarrier(const float* in, float* out) {
  SLUICE_SHARED(tile, float[64]);
  tile[threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}

TEST(EmulationDeathTest, ThreadSanitizerSeesAMissingBarrier) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  setenv("TSAN_OPTIONS", "halt_on_error=1", 1);  // read by the re-executed child
  EXPECT_DEATH(
      {
        float* in = DeviceCopy(std::vector<float>(64, 1.f));
        float* out = DeviceCopy(std::vector<float>(64, 0.f));
        SLUICE_LAUNCH(1, 64, 0, nullptr, ReverseWithoutBarrier)(in, out);
        cudaDeviceSynchronize();
      },
      "data race");
}
#endif

}  // namespace
