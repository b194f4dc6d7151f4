#include "kvstore/memory/cuda/gpu_page_allocator.h"

#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kvstore/memory/cuda/device_scan.h"
#include "kvstore/memory/cuda/gpu_page_allocator_kernels.h"

namespace sluice::kvstore::cuda {
namespace {

constexpr int64_t kMaxPages = std::numeric_limits<PageId>::max();
constexpr int64_t kMaxBatch = std::numeric_limits<int32_t>::max();  // ids per Free or Retain

DevicePageList ListOf(const DeviceArray<int32_t>& free_list, const DeviceArray<int32_t>& refcount,
                      const DeviceArray<int32_t>& last, int64_t num_pages) {
  return {free_list.data(), refcount.data(), last.data(), num_pages};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuPageAllocator>> GpuPageAllocator::Create(int64_t num_pages,
                                                                           int64_t page_bytes,
                                                                           cudaStream_t stream) {
  if (num_pages < 1 || num_pages > kMaxPages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a GPU page pool holds between 1 and %d pages, not %d", kMaxPages, num_pages));
  }
  if (page_bytes < 0 || page_bytes % kPageAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GPU page size must be 0 (no arena) or a positive multiple of %d bytes, not %d",
        kPageAlignment, page_bytes));
  }
  if (page_bytes > 0 && page_bytes > std::numeric_limits<int64_t>::max() / num_pages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d pages of %d bytes overflow a 64-bit arena size", num_pages, page_bytes));
  }
  SLUICE_RETURN_IF_ERROR(CudaDeviceAvailable());
  std::unique_ptr<GpuPageAllocator> pool(new GpuPageAllocator(num_pages, page_bytes, stream));
  pool->free_count_ = num_pages;
  if (page_bytes > 0) {
    if (absl::Status s = pool->arena_.Reserve(num_pages * page_bytes); !s.ok()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cannot allocate a %d-byte GPU page arena (%d pages of %d bytes); lower the page "
          "count: %s",
          num_pages * page_bytes, num_pages, page_bytes, s.message()));
    }
  }
  SLUICE_RETURN_IF_ERROR(pool->free_list_.Reserve(num_pages));
  SLUICE_RETURN_IF_ERROR(pool->refcount_.Reserve(num_pages));
  SLUICE_RETURN_IF_ERROR(pool->last_.Reserve(num_pages));
  SLUICE_RETURN_IF_ERROR(pool->ids_.Reserve(num_pages));
  SLUICE_RETURN_IF_ERROR(pool->errors_.Reserve(1));
  SLUICE_RETURN_IF_ERROR(pool->errors_host_.Reserve(1));
  SLUICE_RETURN_IF_ERROR(pool->total_host_.Reserve(1));
  SLUICE_ASSIGN_OR_RETURN(pool->counts_uploaded_, CudaEvent::Create());
  std::vector<int32_t> all(num_pages);
  std::iota(all.begin(), all.end(), 0);
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pool->free_list_.data(), all.data(),
                                              pool->free_list_.bytes(), cudaMemcpyHostToDevice,
                                              stream));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(pool->refcount_.data(), 0, pool->refcount_.bytes(), stream));
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(pool->last_.data(), 0xff, pool->last_.bytes(), stream));  // -1
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return pool;
}

GpuPageAllocator::~GpuPageAllocator() {
  // Queued work may still use the arrays the members free.
  cudaStreamSynchronize(stream_);
}

absl::Status GpuPageAllocator::EnsureScanTemp(int64_t items) {
  if (items <= scan_temp_items_) return absl::OkStatus();
  size_t bytes = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(ExclusiveScanTempBytes(items, &bytes));
  SLUICE_RETURN_IF_ERROR(scan_temp_.Reserve(static_cast<int64_t>(bytes) + 1));
  scan_temp_items_ = items;
  return absl::OkStatus();
}

absl::StatusOr<GpuPageAllocator::Allocation> GpuPageAllocator::Allocate(
    absl::Span<const int32_t> counts) {
  const int64_t n = static_cast<int64_t>(counts.size());
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (counts[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d of the batch asks for %d pages; a page count must be >= 0", i, counts[i]));
    }
    total += counts[i];
  }
  if (total > free_count_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a batch of %d requests asks for %d pages but only %d of %d GPU pages are free; nothing "
        "was allocated",
        n, total, free_count_, num_pages_));
  }
  // The staging buffer may still be read by the previous call's upload.
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(counts_uploaded_.get()));
  SLUICE_RETURN_IF_ERROR(counts_staging_.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(counts_.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(offsets_.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(EnsureScanTemp(n + 1));
  if (n > 0) std::memcpy(counts_staging_.data(), counts.data(), n * sizeof(int32_t));
  counts_staging_.data()[n] = 0;  // so that offsets[n] = total
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(counts_.data(), counts_staging_.data(),
                                              (n + 1) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                              stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(counts_uploaded_.get(), stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchExclusiveScan(counts_.data(), offsets_.data(), n + 1,
                                                  scan_temp_.data(), scan_temp_.bytes(), stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchTakePages(ListOf(free_list_, refcount_, last_, num_pages_),
                                              start_, total, ids_.data(), stream_));
  start_ = (start_ + total) % num_pages_;
  free_count_ -= total;
  return Allocation{.offsets = offsets_.data(), .ids = ids_.data(), .requests = n, .total = total};
}

absl::StatusOr<const PageId*> GpuPageAllocator::UploadIds(absl::Span<const PageId> ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  SLUICE_RETURN_IF_ERROR(ids_upload_.Reserve(n));
  // From pageable memory: the copy is staged before cudaMemcpyAsync returns, so `ids` may go
  // away afterwards; the callers synchronize anyway.
  if (n > 0) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ids_upload_.data(), ids.data(), n * sizeof(PageId),
                                                cudaMemcpyHostToDevice, stream_));
  }
  return ids_upload_.data();
}

absl::Status GpuPageAllocator::ReadErrors(DeviceBatchErrors* errors) {
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(errors_host_.data(), errors_.data(),
                                              sizeof(DeviceBatchErrors), cudaMemcpyDeviceToHost,
                                              stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  *errors = *errors_host_.data();
  return absl::OkStatus();
}

PageId GpuPageAllocator::IdAt(const PageId* ids, int64_t k) {
  PageId id = kNoPage;
  if (cudaMemcpyAsync(&id, ids + k, sizeof(id), cudaMemcpyDeviceToHost, stream_) != cudaSuccess ||
      cudaStreamSynchronize(stream_) != cudaSuccess) {
    return kNoPage;
  }
  return id;
}

absl::Status GpuPageAllocator::Free(absl::Span<const PageId> ids) {
  if (ids.empty()) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(const PageId* device_ids, UploadIds(ids));
  return Free(device_ids, static_cast<int64_t>(ids.size()));
}

absl::Status GpuPageAllocator::Free(const PageId* ids, int64_t n) {
  if (n == 0) return absl::OkStatus();
  if (n < 0 || n > kMaxBatch || ids == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GpuPageAllocator::Free takes 0 to %d device ids, not %d at %p", kMaxBatch, n, ids));
  }
  SLUICE_RETURN_IF_ERROR(zero_flags_.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(zero_offsets_.Reserve(n + 1));
  SLUICE_RETURN_IF_ERROR(EnsureScanTemp(n + 1));
  const DevicePageList list = ListOf(free_list_, refcount_, last_, num_pages_);
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(errors_.data(), 0xff, sizeof(DeviceBatchErrors), stream_));  // kNoError
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchDropReferences(list, ids, n, errors_.data(), stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchFlagFreed(list, ids, n, zero_flags_.data(), stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(LaunchExclusiveScan(zero_flags_.data(), zero_offsets_.data(), n + 1,
                                                  scan_temp_.data(), scan_temp_.bytes(), stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(total_host_.data(), zero_offsets_.data() + n,
                                              sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
  DeviceBatchErrors errors;
  SLUICE_RETURN_IF_ERROR(ReadErrors(&errors));
  if (errors.out_of_range != kNoError || errors.bad_refcount != kNoError) {
    SLUICE_CUDA_RETURN_IF_ERROR(LaunchRestoreReferences(list, ids, n, stream_));
    if (errors.out_of_range != kNoError) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot free page %d (entry %d of the batch): the pool has pages 0..%d; nothing was "
          "freed",
          IdAt(ids, static_cast<int64_t>(errors.out_of_range)), errors.out_of_range,
          num_pages_ - 1));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot free page %d (entry %d of the batch): it is not allocated, or is listed more "
        "times than it is referenced (double free); nothing was freed",
        IdAt(ids, static_cast<int64_t>(errors.bad_refcount)), errors.bad_refcount));
  }
  const int64_t freed = *total_host_.data();
  const int64_t end = (start_ + free_count_) % num_pages_;
  SLUICE_CUDA_RETURN_IF_ERROR(
      LaunchRecycle(list, ids, n, zero_flags_.data(), zero_offsets_.data(), end, stream_));
  free_count_ += freed;
  return absl::OkStatus();
}

absl::Status GpuPageAllocator::Retain(absl::Span<const PageId> ids) {
  if (ids.empty()) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(const PageId* device_ids, UploadIds(ids));
  return Retain(device_ids, static_cast<int64_t>(ids.size()));
}

absl::Status GpuPageAllocator::Retain(const PageId* ids, int64_t n) {
  if (n == 0) return absl::OkStatus();
  if (n < 0 || n > kMaxBatch || ids == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GpuPageAllocator::Retain takes 0 to %d device ids, not %d at %p", kMaxBatch, n, ids));
  }
  const DevicePageList list = ListOf(free_list_, refcount_, last_, num_pages_);
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(errors_.data(), 0xff, sizeof(DeviceBatchErrors), stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(
      LaunchAddReferences(list, ids, n, /*undo=*/false, errors_.data(), stream_));
  DeviceBatchErrors errors;
  SLUICE_RETURN_IF_ERROR(ReadErrors(&errors));
  if (errors.out_of_range == kNoError && errors.bad_refcount == kNoError &&
      errors.overflow == kNoError) {
    return absl::OkStatus();
  }
  SLUICE_CUDA_RETURN_IF_ERROR(
      LaunchAddReferences(list, ids, n, /*undo=*/true, errors_.data(), stream_));
  if (errors.out_of_range != kNoError && errors.out_of_range < errors.bad_refcount) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot retain page %d (entry %d of the batch): the pool has pages 0..%d; nothing was "
        "retained",
        IdAt(ids, static_cast<int64_t>(errors.out_of_range)), errors.out_of_range, num_pages_ - 1));
  }
  if (errors.bad_refcount != kNoError) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot retain page %d (entry %d of the batch): it is free (released by its last "
        "owner?); nothing was retained",
        IdAt(ids, static_cast<int64_t>(errors.bad_refcount)), errors.bad_refcount));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "page %d (entry %d of the batch) already has %d references; nothing was retained",
      IdAt(ids, static_cast<int64_t>(errors.overflow)), errors.overflow,
      std::numeric_limits<int32_t>::max()));
}

absl::StatusOr<std::vector<int32_t>> GpuPageAllocator::Refcounts() const {
  std::vector<int32_t> out(num_pages_);
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), refcount_.data(), refcount_.bytes(),
                                              cudaMemcpyDeviceToHost, stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return out;
}

absl::StatusOr<std::vector<PageId>> GpuPageAllocator::FreeList() const {
  std::vector<int32_t> all(num_pages_);
  SLUICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(all.data(), free_list_.data(), free_list_.bytes(),
                                              cudaMemcpyDeviceToHost, stream_));
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::vector<PageId> free(free_count_);
  for (int64_t k = 0; k < free_count_; ++k) free[k] = all[(start_ + k) % num_pages_];
  return free;
}

}  // namespace sluice::kvstore::cuda
