#include "kvstore/memory/page_table.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"

namespace sluice::kvstore {
namespace {

constexpr int64_t kMaxCapacity = std::numeric_limits<int32_t>::max();

}  // namespace

BidirectionalPageTable::BidirectionalPageTable(int32_t initial_capacity)
    : slots_(std::max(initial_capacity, 0), kNoPage) {}

void BidirectionalPageTable::Regrow(int64_t capacity) {
  std::vector<PageId> grown(capacity, kNoPage);
  std::copy(slots_.begin(), slots_.begin() + high_count_, grown.begin());
  std::copy(slots_.end() - low_count_, slots_.end(), grown.end() - low_count_);
  slots_ = std::move(grown);
}

void BidirectionalPageTable::Reserve(int32_t capacity) {
  if (capacity > this->capacity()) Regrow(capacity);
}

absl::Status BidirectionalPageTable::MakeRoomForOne() {
  const int64_t cap = capacity();
  if (high_count_ + low_count_ < cap) return absl::OkStatus();
  if (cap == kMaxCapacity) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("a page table holds at most %d pages", kMaxCapacity));
  }
  Regrow(std::min(std::max<int64_t>(4, 2 * cap), kMaxCapacity));
  return absl::OkStatus();
}

absl::Status BidirectionalPageTable::PushHigh(PageId id) {
  if (id < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot add page %d to a page table: page ids are >= 0", id));
  }
  if (absl::Status st = MakeRoomForOne(); !st.ok()) return st;
  slots_[high_count_++] = id;
  return absl::OkStatus();
}

absl::Status BidirectionalPageTable::PushLow(PageId id) {
  if (id < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot add page %d to a page table: page ids are >= 0", id));
  }
  if (absl::Status st = MakeRoomForOne(); !st.ok()) return st;
  slots_[slots_.size() - 1 - low_count_++] = id;
  return absl::OkStatus();
}

absl::StatusOr<PageId> BidirectionalPageTable::PopHigh() {
  if (high_count_ == 0) return absl::OutOfRangeError("PopHigh: the table has no high-tier page");
  const PageId id = slots_[--high_count_];
  slots_[high_count_] = kNoPage;
  return id;
}

absl::StatusOr<PageId> BidirectionalPageTable::PopLow() {
  if (low_count_ == 0) return absl::OutOfRangeError("PopLow: the table has no low-tier page");
  const size_t at = slots_.size() - low_count_--;
  const PageId id = slots_[at];
  slots_[at] = kNoPage;
  return id;
}

absl::Status BidirectionalPageTable::EraseHigh(int32_t i) {
  if (i < 0 || i >= high_count_) {
    return absl::OutOfRangeError(
        absl::StrFormat("EraseHigh(%d): the table holds %d high-tier pages", i, high_count_));
  }
  std::copy(slots_.begin() + i + 1, slots_.begin() + high_count_, slots_.begin() + i);
  slots_[--high_count_] = kNoPage;
  return absl::OkStatus();
}

absl::Status BidirectionalPageTable::ReplaceHigh(int32_t i, PageId id) {
  if (i < 0 || i >= high_count_) {
    return absl::OutOfRangeError(
        absl::StrFormat("ReplaceHigh(%d): the table holds %d high-tier pages", i, high_count_));
  }
  if (id < 0) return absl::InvalidArgumentError(absl::StrFormat("ReplaceHigh: page id %d", id));
  slots_[i] = id;
  return absl::OkStatus();
}

absl::Status BidirectionalPageTable::ReplaceLow(int32_t i, PageId id) {
  if (i < 0 || i >= low_count_) {
    return absl::OutOfRangeError(
        absl::StrFormat("ReplaceLow(%d): the table holds %d low-tier pages", i, low_count_));
  }
  if (id < 0) return absl::InvalidArgumentError(absl::StrFormat("ReplaceLow: page id %d", id));
  slots_[slots_.size() - 1 - i] = id;
  return absl::OkStatus();
}

absl::Status BidirectionalPageTable::EraseLow(int32_t i) {
  if (i < 0 || i >= low_count_) {
    return absl::OutOfRangeError(
        absl::StrFormat("EraseLow(%d): the table holds %d low-tier pages", i, low_count_));
  }
  // Low page j sits at cap - 1 - j: the later pages [cap - low_count, cap - 1 - i) move one
  // place to the right.
  const auto first = slots_.end() - low_count_;
  const auto erased = slots_.end() - 1 - i;
  std::copy_backward(first, erased, erased + 1);
  *first = kNoPage;
  --low_count_;
  return absl::OkStatus();
}

void BidirectionalPageTable::Clear() {
  std::fill(slots_.begin(), slots_.end(), kNoPage);
  high_count_ = 0;
  low_count_ = 0;
}

std::vector<PageId> BidirectionalPageTable::AllPages() const {
  std::vector<PageId> pages(slots_.begin(), slots_.begin() + high_count_);
  pages.insert(pages.end(), slots_.rbegin(), slots_.rbegin() + low_count_);
  return pages;
}

}  // namespace sluice::kvstore
