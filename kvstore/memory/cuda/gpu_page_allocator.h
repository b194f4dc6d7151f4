// The page pool in device memory (LeanKV §5.2): an arena of fixed-size pages and the circular
// free page list that hands them out, with batch allocation and recycling by parallel prefix sum
// (CUB) and per-page reference counts, all on the GPU. Same semantics as kvstore::PagePool (same
// ids in the same order for the same sequence of calls), so the two can be checked against each
// other.
//
//   SLUICE_ASSIGN_OR_RETURN(auto pool, GpuPageAllocator::Create(65536, 16 * 1024, stream));
//   SLUICE_ASSIGN_OR_RETURN(GpuPageAllocator::Allocation a, pool->Allocate(new_pages_per_head));
//   // head h owns a.ids[a.offsets[h], a.offsets[h + 1]) (device memory)
//   SLUICE_RETURN_IF_ERROR(pool->Free(compacted.device_freed_ids, compacted.freed.size()));
//
// Where the inputs live, and what synchronizes:
//  - Allocate takes the page counts on the host: the decode scheduler decides on the host which
//    (sequence, layer, head) lists open a page this step (their last page is full), so the
//    counts are there already, and the host can check them (negative counts, enough free
//    pages) against its exact mirror of the free count before anything is queued. Allocate
//    does not wait for the device (unless its scratch buffers grow, or the previous call's
//    counts are still being uploaded): it uploads the counts, scans them on the device (CUB)
//    and gathers the pages there; the result stays in device memory for the kernels that fill
//    the pages.
//  - Free and Retain take device ids (a compaction's freed pages never leave the GPU); host-span
//    overloads upload first. Validity (range, double free, refcount overflow) is checked on the
//    device, in every build, with error flags the kernels set atomically; the call synchronizes
//    the stream once to read them and the number of pages that reached refcount zero (Free
//    needs it to move the end pointer); on error the references are restored on the device
//    before the call returns, so nothing changes.
//
// Not thread-safe; one owner thread, one stream. All device work is queued on that stream in
// order. Device memory is freed by the destructor (after the stream's work has finished).
#ifndef SLUICE_KVSTORE_MEMORY_CUDA_GPU_PAGE_ALLOCATOR_H_
#define SLUICE_KVSTORE_MEMORY_CUDA_GPU_PAGE_ALLOCATOR_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/device_array.h"
#include "kvstore/memory/page_pool.h"

namespace sluice::kvstore::cuda {

using kernels::cuda::CudaDeviceAvailable;
using kernels::cuda::CudaEvent;
using kernels::cuda::DeviceArray;
using kernels::cuda::PinnedArray;

struct DeviceBatchErrors;  // gpu_page_allocator_kernels.h

// A view of a device page arena: page `id` starts at base + id * page_bytes.
struct GpuArena {
  uint8_t* base = nullptr;  // device memory, [num_pages * page_bytes]
  int64_t num_pages = 0;
  int64_t page_bytes = 0;
};

class GpuPageAllocator {
 public:
  // An arena of num_pages pages of page_bytes bytes in device memory (page_bytes 0: no arena,
  // ids only) and the device free list, every page free. InvalidArgument unless
  // 1 <= num_pages <= 2^31 - 1 and page_bytes is 0 or a positive multiple of 64; Unavailable
  // without a CUDA device; ResourceExhausted when the device memory cannot be allocated.
  // `stream` (not owned; nullptr = the legacy default stream) carries all of the pool's work.
  static absl::StatusOr<std::unique_ptr<GpuPageAllocator>> Create(
      int64_t num_pages, int64_t page_bytes = kDefaultPageBytes, cudaStream_t stream = nullptr);

  GpuPageAllocator(const GpuPageAllocator&) = delete;
  GpuPageAllocator& operator=(const GpuPageAllocator&) = delete;
  ~GpuPageAllocator();

  // The first byte of page `id` in device memory; `id` must be in [0, num_pages()).
  uint8_t* data(PageId id) const { return arena_.data() + int64_t{id} * page_bytes_; }
  GpuArena arena() const { return {arena_.data(), num_pages_, page_bytes_}; }

  int64_t page_bytes() const { return page_bytes_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const { return free_count_; }
  int64_t used_pages() const { return num_pages_ - free_count_; }
  cudaStream_t stream() const { return stream_; }

  // A batch allocation's result, in device memory owned by the pool: valid until the next
  // Allocate (Free and Retain leave it alone).
  struct Allocation {
    const int64_t* offsets = nullptr;  // [requests + 1] exclusive prefix sum of the counts
    const PageId* ids = nullptr;       // [total]; request i owns ids[offsets[i], offsets[i + 1])
    int64_t requests = 0;
    int64_t total = 0;
  };

  // Batch allocation: request i asks for counts[i] pages (0 is fine); each new page has
  // refcount 1. All or nothing, checked on the host before any work is queued: InvalidArgument
  // for a negative count, ResourceExhausted when the batch asks for more pages than are free.
  // Does not synchronize.
  absl::StatusOr<Allocation> Allocate(absl::Span<const int32_t> counts);

  // Drops one reference from each of the n ids (device memory); pages whose refcount reaches
  // zero return to the free list at the end pointer, in the order of the last occurrence of
  // their id in the list (PagePool's order). InvalidArgument naming the id for an id out of
  // range (reported first) or dropped more often than it is referenced (double free); nothing
  // changes on error. Synchronizes the stream once.
  absl::Status Free(const PageId* ids, int64_t n);
  absl::Status Free(absl::Span<const PageId> ids);  // host ids

  // Adds one reference to each of the n ids. InvalidArgument naming the id for an id out of
  // range or free; ResourceExhausted if a refcount would pass 2^31 - 1; nothing changes on
  // error. Synchronizes the stream once.
  absl::Status Retain(const PageId* ids, int64_t n);
  absl::Status Retain(absl::Span<const PageId> ids);  // host ids

  // Debugging and tests (synchronize): every page's refcount, and the free page ids from the
  // start pointer on (the order in which they will be allocated).
  absl::StatusOr<std::vector<int32_t>> Refcounts() const;
  absl::StatusOr<std::vector<PageId>> FreeList() const;

 private:
  GpuPageAllocator(int64_t num_pages, int64_t page_bytes, cudaStream_t stream)
      : num_pages_(num_pages), page_bytes_(page_bytes), stream_(stream) {}

  // Makes `ids` (n host ids) device memory in ids_upload_; synchronizes.
  absl::StatusOr<const PageId*> UploadIds(absl::Span<const PageId> ids);
  // Reads errors_ (and, with `total`, total_host_) back after the queued work (synchronizes).
  absl::Status ReadErrors(DeviceBatchErrors* errors);
  // The id at index k of a device id list (synchronizes; error messages only).
  PageId IdAt(const PageId* ids, int64_t k);
  absl::Status EnsureScanTemp(int64_t items);

  const int64_t num_pages_;
  const int64_t page_bytes_;
  cudaStream_t stream_;

  // Host mirror of the list's pointers: exact, since every change goes through this object.
  int64_t start_ = 0;
  int64_t free_count_ = 0;

  DeviceArray<uint8_t> arena_;
  DeviceArray<int32_t> free_list_;  // [num_pages]
  DeviceArray<int32_t> refcount_;   // [num_pages]
  DeviceArray<int32_t> last_;       // [num_pages]
  DeviceArray<DeviceBatchErrors> errors_;
  PinnedArray<DeviceBatchErrors> errors_host_;
  PinnedArray<int64_t> total_host_;

  // Allocate: counts staged in pinned memory (the previous upload must finish before the
  // staging buffer is rewritten: counts_uploaded_), their scan, the ids.
  PinnedArray<int32_t> counts_staging_;
  CudaEvent counts_uploaded_;
  DeviceArray<int32_t> counts_;
  DeviceArray<int64_t> offsets_;
  DeviceArray<int32_t> ids_;  // [num_pages]
  // Free: per-id flags and their scan.
  DeviceArray<int32_t> zero_flags_;
  DeviceArray<int64_t> zero_offsets_;
  DeviceArray<int32_t> ids_upload_;
  // CUB scan temporary storage, sized for the largest scan so far.
  DeviceArray<uint8_t> scan_temp_;
  int64_t scan_temp_items_ = 0;
};

}  // namespace sluice::kvstore::cuda

#endif  // SLUICE_KVSTORE_MEMORY_CUDA_GPU_PAGE_ALLOCATOR_H_
