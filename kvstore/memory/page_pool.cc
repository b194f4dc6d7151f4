#include "kvstore/memory/page_pool.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace sluice::kvstore {
namespace {

constexpr int64_t kMaxPages = std::numeric_limits<PageId>::max();
constexpr int32_t kMaxRefcount = std::numeric_limits<int32_t>::max();

// Index of the first negative entry of c[0, n), or -1.
int64_t FirstNegative(const int32_t* c, int64_t n) {
  const int32_t* it = std::find_if(c, c + n, [](int32_t v) { return v < 0; });
  return it == c + n ? -1 : it - c;
}

// The exclusive prefix sum of c[0, n) into out[0, n] (out[n] = total). Returns the index of
// the first negative entry, or -1; out is then unspecified.
int64_t SequentialScan(const int32_t* c, int64_t n, int64_t* out) {
  int64_t sum = 0;
  uint32_t signs = 0;  // the OR of all entries: its top bit is set iff one is negative
  for (int64_t i = 0; i < n; ++i) {
    out[i] = sum;
    sum += c[i];
    signs |= static_cast<uint32_t>(c[i]);
  }
  out[n] = sum;
  return (signs >> 31) ? FirstNegative(c, n) : -1;
}

#ifdef _OPENMP
// Two-pass blocked scan: each thread sums its block, one thread scans the block sums, then each
// thread writes its block's offsets. Same contract as SequentialScan.
int64_t ParallelScan(const int32_t* c, int64_t n, int64_t* out) {
  const int max_threads = omp_get_max_threads();
  std::vector<int64_t> block_sum(max_threads + 1, 0);
  int threads_used = 1;
  bool negative = false;
#pragma omp parallel num_threads(max_threads) reduction(|| : negative)
  {
    const int t = omp_get_thread_num();
    const int threads = omp_get_num_threads();
    const int64_t lo = n * t / threads;
    const int64_t hi = n * (t + 1) / threads;
    int64_t sum = 0;
    uint32_t signs = 0;
    for (int64_t i = lo; i < hi; ++i) {
      sum += c[i];
      signs |= static_cast<uint32_t>(c[i]);
    }
    block_sum[t + 1] = sum;
    negative = (signs >> 31) != 0;
#pragma omp barrier
#pragma omp single
    {
      for (int k = 0; k < threads; ++k) block_sum[k + 1] += block_sum[k];
      threads_used = threads;
    }  // implicit barrier: every block sees the scanned sums
    int64_t run = block_sum[t];
    for (int64_t i = lo; i < hi; ++i) {
      out[i] = run;
      run += c[i];
    }
  }
  out[n] = block_sum[threads_used];
  return negative ? FirstNegative(c, n) : -1;
}
#endif  // _OPENMP

int64_t ExclusiveScan(absl::Span<const int32_t> counts, int64_t* out) {
  const int64_t n = static_cast<int64_t>(counts.size());
#ifdef _OPENMP
  // Below the threshold, waking the thread team costs more than the scan; inside a parallel
  // region (nested parallelism is off) the team would be one thread anyway.
  if (n > PagePool::kParallelScanMin && omp_get_max_threads() > 1 && !omp_in_parallel()) {
    return ParallelScan(counts.data(), n, out);
  }
#endif
  return SequentialScan(counts.data(), n, out);
}

}  // namespace

void PagePool::ArenaFree::operator()(uint8_t* p) const { std::free(p); }

absl::Status PagePool::CheckShape(int64_t num_pages, int64_t page_bytes) {
  if (num_pages < 1 || num_pages > kMaxPages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a page pool holds between 1 and %d pages, not %d", kMaxPages, num_pages));
  }
  if (page_bytes <= 0 || page_bytes % kPageAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page size must be a positive multiple of %d bytes, not %d", kPageAlignment, page_bytes));
  }
  if (page_bytes > std::numeric_limits<int64_t>::max() / num_pages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d pages of %d bytes overflow a 64-bit arena size", num_pages, page_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(int64_t num_pages, int64_t page_bytes) {
  SLUICE_RETURN_IF_ERROR(CheckShape(num_pages, page_bytes));
  const int64_t arena_bytes = num_pages * page_bytes;
  // arena_bytes is a multiple of the alignment, as aligned_alloc requires.
  void* arena = std::aligned_alloc(kPageAlignment, static_cast<size_t>(arena_bytes));
  if (arena == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot allocate a %d-byte page arena (%d pages of %d bytes); lower "
                        "the page count",
                        arena_bytes, num_pages, page_bytes));
  }
  return std::unique_ptr<PagePool>(
      new PagePool(static_cast<uint8_t*>(arena), num_pages, page_bytes));
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::CreateOver(uint8_t* arena, size_t arena_bytes,
                                                               int64_t num_pages,
                                                               int64_t page_bytes) {
  SLUICE_RETURN_IF_ERROR(CheckShape(num_pages, page_bytes));
  if (arena == nullptr || reinterpret_cast<uintptr_t>(arena) % kPageAlignment != 0 ||
      arena_bytes < static_cast<size_t>(num_pages * page_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "an arena for %d pages of %d bytes needs %d bytes at a %d-byte aligned address", num_pages,
        page_bytes, num_pages * page_bytes, kPageAlignment));
  }
  std::unique_ptr<PagePool> pool(new PagePool(arena, num_pages, page_bytes));
  pool->arena_owner_.release();  // the caller's memory
  return pool;
}

PagePool::PagePool(uint8_t* arena, int64_t num_pages, int64_t page_bytes)
    : arena_owner_(arena),
      arena_(arena),
      num_pages_(num_pages),
      page_bytes_(page_bytes),
      free_list_(num_pages),
      free_count_(num_pages),
      refcount_(num_pages, 0) {
  for (int64_t i = 0; i < num_pages; ++i) free_list_[i] = static_cast<PageId>(i);
}

PagePool::~PagePool() = default;

absl::Status PagePool::Allocate(absl::Span<const int32_t> counts, std::vector<int64_t>* offsets,
                                std::vector<PageId>* ids) {
  if (offsets == nullptr || ids == nullptr) {
    return absl::InvalidArgumentError("PagePool::Allocate needs non-null offsets and ids");
  }
  const int64_t n = static_cast<int64_t>(counts.size());
  offsets->resize(n + 1);
  ids->clear();
  const int64_t bad = ExclusiveScan(counts, offsets->data());
  if (bad >= 0) {
    offsets->clear();
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d of the batch asks for %d pages; a page count must be >= 0", bad, counts[bad]));
  }
  const int64_t total = offsets->back();
  if (total > free_count_) {
    offsets->clear();
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a batch of %d requests asks for %d pages but only %d of %d pages are free; nothing was "
        "allocated",
        n, total, free_count_, num_pages_));
  }
  // The free region starting at start_ wraps at most once: two contiguous runs.
  const int64_t first = std::min(total, num_pages_ - start_);
  ids->reserve(total);
  ids->insert(ids->end(), free_list_.begin() + start_, free_list_.begin() + start_ + first);
  ids->insert(ids->end(), free_list_.begin(), free_list_.begin() + (total - first));
  const PageId* taken = ids->data();
  int32_t* refcount = refcount_.data();
  if (total > kParallelScanMin) {
    // Ids in the free region are distinct, so the scatter is race-free. (An `if` clause on the
    // pragma would still enter the OpenMP runtime for small batches, costing ~0.5 us a call.)
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < total; ++k) refcount[taken[k]] = 1;
  } else {
    for (int64_t k = 0; k < total; ++k) refcount[taken[k]] = 1;
  }
  start_ = (start_ + total) % num_pages_;
  free_count_ -= total;
  return absl::OkStatus();
}

absl::StatusOr<PageId> PagePool::AllocateOne() {
  if (free_count_ == 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("all %d pages of the pool are in use", num_pages_));
  }
  const PageId id = free_list_[start_];
  refcount_[id] = 1;
  start_ = start_ + 1 == num_pages_ ? 0 : start_ + 1;
  --free_count_;
  return id;
}

absl::Status PagePool::Retain(absl::Span<const PageId> ids) {
  for (const PageId id : ids) {
    if (id < 0 || id >= num_pages_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot retain page %d: the pool has pages 0..%d; nothing was retained",
                          id, num_pages_ - 1));
    }
    if (refcount_[id] == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot retain page %d: it is free (released by its last owner?); nothing was retained",
          id));
    }
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    int32_t& rc = refcount_[ids[k]];
    if (rc == kMaxRefcount) {
      for (size_t j = 0; j < k; ++j) --refcount_[ids[j]];
      return absl::ResourceExhaustedError(absl::StrFormat(
          "page %d already has %d references; nothing was retained", ids[k], kMaxRefcount));
    }
    ++rc;
  }
  return absl::OkStatus();
}

absl::Status PagePool::Free(absl::Span<const PageId> ids) {
  for (const PageId id : ids) {
    if (id < 0 || id >= num_pages_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot free page %d: the pool has pages 0..%d; nothing was freed", id, num_pages_ - 1));
    }
  }
  // One pass drops the references and writes each page that reaches zero after the end pointer.
  // Those writes land in the used region (at most used_pages() pages reach zero), whose entries
  // are stale, so on error undoing the decrements alone restores the pool. The pass is
  // sequential: an id may appear more than once, so the decrements do not commute with the
  // zero test without atomics (the GPU pool uses them); the running count `freed` is the
  // prefix sum of the "reached zero" flags.
  int64_t end = start_ + free_count_;
  if (end >= num_pages_) end -= num_pages_;
  int64_t freed = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    int32_t& rc = refcount_[ids[k]];
    if (rc == 0) {
      for (size_t j = 0; j < k; ++j) ++refcount_[ids[j]];
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot free page %d: it is not allocated, or is listed more times than it is "
          "referenced (double free); nothing was freed",
          ids[k]));
    }
    if (--rc == 0) {
      int64_t at = end + freed;
      if (at >= num_pages_) at -= num_pages_;
      free_list_[at] = ids[k];
      ++freed;
    }
  }
  free_count_ += freed;
  return absl::OkStatus();
}

int32_t PagePool::refcount(PageId id) const {
  if (id < 0 || id >= num_pages_) return 0;
  return refcount_[id];
}

}  // namespace sluice::kvstore
