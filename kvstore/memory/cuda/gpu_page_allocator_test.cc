// The GPU page pool against the CPU one (kvstore::PagePool): the same random sequences of batch
// allocations, frees and retains must give the same offsets, the same ids in the same order,
// the same errors and the same refcounts. Argument checks that need no device run everywhere;
// the rest skip, saying why, where there is no CUDA device.
#include "kvstore/memory/cuda/gpu_page_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_array.h"
#include "kernels/test_util/backend_cases.h"
#include "kvstore/memory/page_pool.h"

namespace sluice::kvstore::cuda {

using kernels::cuda::CudaDeviceAvailable;
using kernels::cuda::CudaEvent;
using kernels::cuda::DeviceArray;
using kernels::cuda::PinnedArray;
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

#define SKIP_WITHOUT_CUDA_DEVICE()                                                    \
  do {                                                                                \
    if (absl::Status s = CudaDeviceAvailable(); !s.ok()) GTEST_SKIP() << s.message(); \
  } while (0)

using kernels::testing::TestSeed;

template <typename T>
std::vector<T> Download(const T* device, int64_t n) {
  std::vector<T> host(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

// Allocates `counts` from both pools and expects the same outcome; returns the ids (empty on
// error).
std::vector<PageId> AllocateBoth(PagePool& cpu, GpuPageAllocator& gpu,
                                 const std::vector<int32_t>& counts) {
  std::vector<int64_t> offsets;
  std::vector<PageId> ids;
  const absl::Status want = cpu.Allocate(counts, &offsets, &ids);
  const absl::StatusOr<GpuPageAllocator::Allocation> got = gpu.Allocate(counts);
  EXPECT_EQ(got.status().code(), want.code()) << got.status() << " vs " << want;
  if (!got.ok() || !want.ok()) return {};
  EXPECT_EQ(got->requests, static_cast<int64_t>(counts.size()));
  EXPECT_EQ(got->total, static_cast<int64_t>(ids.size()));
  EXPECT_THAT(Download(got->offsets, got->requests + 1), ElementsAreArray(offsets));
  EXPECT_THAT(Download(got->ids, got->total), ElementsAreArray(ids));
  return ids;
}

void ExpectSameState(const PagePool& cpu, const GpuPageAllocator& gpu) {
  EXPECT_EQ(gpu.free_pages(), cpu.free_pages());
  absl::StatusOr<std::vector<int32_t>> refcounts = gpu.Refcounts();
  ASSERT_TRUE(refcounts.ok()) << refcounts.status();
  for (int64_t id = 0; id < cpu.num_pages(); ++id) {
    ASSERT_EQ((*refcounts)[id], cpu.refcount(static_cast<PageId>(id))) << "page " << id;
  }
}

TEST(GpuPageAllocator, CreateRejectsBadShapesWithoutTouchingTheDevice) {
  for (const auto& [pages, bytes] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1024}, {int64_t{1} << 31, 0}, {16, 100}, {16, -64}}) {
    auto pool = GpuPageAllocator::Create(pages, bytes);
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument)
        << pages << " x " << bytes << ": " << pool.status();
  }
}

TEST(GpuPageAllocator, WithoutDeviceCreateIsUnavailable) {
  if (CudaDeviceAvailable().ok()) GTEST_SKIP() << "a CUDA device is present";
  auto pool = GpuPageAllocator::Create(16, 1024);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnavailable) << pool.status();
  EXPECT_THAT(pool.status().message(), HasSubstr("CUDA"));
}

TEST(GpuPageAllocator, EmptyBatchesAndZeroCounts) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = GpuPageAllocator::Create(8, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = PagePool::Create(8, 64);
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(AllocateBoth(**cpu, **gpu, {}).empty());
  EXPECT_TRUE(AllocateBoth(**cpu, **gpu, {0, 0, 0}).empty());
  EXPECT_EQ(AllocateBoth(**cpu, **gpu, {0, 2, 0, 1}).size(), 3u);
  EXPECT_TRUE((*gpu)->Free(std::vector<PageId>{}).ok());
  EXPECT_TRUE((*gpu)->Retain(std::vector<PageId>{}).ok());
  ExpectSameState(**cpu, **gpu);
}

TEST(GpuPageAllocator, ExhaustionAndNegativeCountsChangeNothing) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = GpuPageAllocator::Create(10, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = PagePool::Create(10, 64);
  ASSERT_TRUE(cpu.ok());
  auto too_many = (*gpu)->Allocate(std::vector<int32_t>{4, 7});
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_many.status().message(), HasSubstr("only 10 of 10"));
  auto negative = (*gpu)->Allocate(std::vector<int32_t>{1, -1});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("request 1"));
  EXPECT_EQ((*gpu)->free_pages(), 10);
  EXPECT_EQ(AllocateBoth(**cpu, **gpu, {3, 7}).size(), 10u);
  EXPECT_TRUE(AllocateBoth(**cpu, **gpu, {1}).empty());  // both exhausted
  ExpectSameState(**cpu, **gpu);
}

TEST(GpuPageAllocator, FreeAndRetainErrorsChangeNothing) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = GpuPageAllocator::Create(8, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = PagePool::Create(8, 64);
  ASSERT_TRUE(cpu.ok());
  const std::vector<PageId> ids = AllocateBoth(**cpu, **gpu, {3});  // pages 0, 1, 2
  ASSERT_EQ(ids.size(), 3u);

  absl::Status s = (*gpu)->Free(std::vector<PageId>{ids[0], 8});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("page 8"));
  s = (*gpu)->Free(std::vector<PageId>{ids[1], ids[0], ids[1]});  // refcount 1, listed twice
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("double free"));
  s = (*gpu)->Free(std::vector<PageId>{5});  // never allocated
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = (*gpu)->Retain(std::vector<PageId>{ids[2], 6});  // 6 is free
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("free"));
  s = (*gpu)->Retain(std::vector<PageId>{-1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ExpectSameState(**cpu, **gpu);

  // A retained page survives one free and returns to the list on the second.
  ASSERT_TRUE((*gpu)->Retain(std::vector<PageId>{ids[1]}).ok());
  ASSERT_TRUE((*cpu)->Retain({ids[1]}).ok());
  ASSERT_TRUE((*gpu)->Free(std::vector<PageId>{ids[1], ids[0], ids[1]}).ok());
  ASSERT_TRUE((*cpu)->Free({ids[1], ids[0], ids[1]}).ok());
  ExpectSameState(**cpu, **gpu);
  // The whole free list, in order: 3..7 then 0 and 1 (1 reached zero at its last listing).
  EXPECT_EQ(AllocateBoth(**cpu, **gpu, {static_cast<int32_t>((*cpu)->free_pages())}).size(), 7u);
}

TEST(GpuPageAllocator, AllocationIdsCanBeFreedOnTheDevice) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu = GpuPageAllocator::Create(64, 1024);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = PagePool::Create(64, 1024);
  ASSERT_TRUE(cpu.ok());
  const std::vector<PageId> ids = AllocateBoth(**cpu, **gpu, {5, 0, 9});
  ASSERT_EQ(ids.size(), 14u);
  auto again = (*gpu)->Allocate(std::vector<int32_t>{2});  // a different batch result
  ASSERT_TRUE(again.ok());
  std::vector<int64_t> offsets;
  std::vector<PageId> cpu_again;
  ASSERT_TRUE((*cpu)->Allocate({2}, &offsets, &cpu_again).ok());
  ASSERT_TRUE((*gpu)->Free(again->ids, again->total).ok());
  ASSERT_TRUE((*cpu)->Free(cpu_again).ok());
  ExpectSameState(**cpu, **gpu);
  EXPECT_EQ((*gpu)->data(3), (*gpu)->arena().base + 3 * 1024);
}

// Random batches against PagePool: ragged counts with zeros, frees of random references (ids
// listed several times where their refcount allows), retains, injected errors, wrap-around of the
// circular list, and at the end the whole free list compared by allocating all of it.
TEST(GpuPageAllocator, MatchesPagePoolOnRandomBatches) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = TestSeed();
  std::cout << "seed " << seed << " (set SLUICE_TEST_SEED to repeat)\n";
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int64_t num_pages = std::uniform_int_distribution<int64_t>(1, 3000)(rng);
  auto gpu = GpuPageAllocator::Create(num_pages, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = PagePool::Create(num_pages, 64);
  ASSERT_TRUE(cpu.ok());
  std::vector<PageId> refs;  // one entry per reference held
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    const int op = static_cast<int>(uniform(0, 9));
    if (op < 4) {
      std::vector<int32_t> counts(uniform(0, 64));
      const int32_t most = uniform(0, 3) == 0 ? static_cast<int32_t>(num_pages / 4 + 1) : 4;
      for (int32_t& c : counts) c = static_cast<int32_t>(uniform(0, most));
      if (uniform(0, 20) == 0 && !counts.empty()) counts[uniform(0, counts.size() - 1)] = -3;
      const std::vector<PageId> ids = AllocateBoth(**cpu, **gpu, counts);
      refs.insert(refs.end(), ids.begin(), ids.end());
    } else if (op < 8) {
      std::shuffle(refs.begin(), refs.end(), rng);
      const size_t take = static_cast<size_t>(uniform(0, static_cast<int64_t>(refs.size())));
      std::vector<PageId> batch(refs.end() - take, refs.end());
      PageId injected = kNoPage;
      if (uniform(0, 8) == 0) {  // out of range, free, or one reference too many (or not)
        injected = uniform(0, 1) ? static_cast<PageId>(num_pages + uniform(0, 5))
                                 : static_cast<PageId>(uniform(0, num_pages - 1));
        batch.insert(batch.begin() + uniform(0, batch.size()), injected);
      }
      const absl::Status want = (*cpu)->Free(batch);
      const absl::Status got = (*gpu)->Free(batch);
      ASSERT_EQ(got.code(), want.code()) << got << " vs " << want;
      if (want.ok()) {
        refs.resize(refs.size() - take);
        if (injected != kNoPage) refs.erase(std::find(refs.begin(), refs.end(), injected));
      }
    } else {
      std::vector<PageId> batch;
      for (int64_t k = uniform(0, 8); k > 0 && !refs.empty(); --k) {
        batch.push_back(refs[uniform(0, refs.size() - 1)]);
      }
      if (uniform(0, 8) == 0) batch.push_back(static_cast<PageId>(uniform(-2, num_pages + 2)));
      const absl::Status want = (*cpu)->Retain(batch);
      const absl::Status got = (*gpu)->Retain(batch);
      ASSERT_EQ(got.code(), want.code()) << got << " vs " << want;
      if (want.ok()) refs.insert(refs.end(), batch.begin(), batch.end());
    }
    ASSERT_EQ((*gpu)->free_pages(), (*cpu)->free_pages());
    if (round % 25 == 0) ExpectSameState(**cpu, **gpu);
  }
  ExpectSameState(**cpu, **gpu);
  AllocateBoth(**cpu, **gpu, {static_cast<int32_t>((*cpu)->free_pages())});
  EXPECT_EQ((*gpu)->free_pages(), 0);
}

// A batch larger than PagePool::kParallelScanMin: the CPU pool scans on threads, the GPU pool
// with CUB over many blocks.
TEST(GpuPageAllocator, MatchesPagePoolOnALargeBatch) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const uint64_t seed = TestSeed();
  std::cout << "seed " << seed << " (set SLUICE_TEST_SEED to repeat)\n";
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr int64_t kPages = 1 << 20;
  auto gpu = GpuPageAllocator::Create(kPages, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = PagePool::Create(kPages, 64);
  ASSERT_TRUE(cpu.ok());
  std::vector<int32_t> counts(PagePool::kParallelScanMin * 2 + 17);
  for (int32_t& c : counts) c = static_cast<int32_t>(rng() % 8 == 0 ? rng() % 5 : 1);
  const std::vector<PageId> ids = AllocateBoth(**cpu, **gpu, counts);
  ASSERT_FALSE(ids.empty());
  std::vector<PageId> half(ids.begin(), ids.begin() + ids.size() / 2);
  std::shuffle(half.begin(), half.end(), rng);
  ASSERT_TRUE((*cpu)->Free(half).ok());
  ASSERT_TRUE((*gpu)->Free(half).ok());
  ExpectSameState(**cpu, **gpu);
  AllocateBoth(**cpu, **gpu, {static_cast<int32_t>((*cpu)->free_pages())});
}

}  // namespace
}  // namespace sluice::kvstore::cuda
