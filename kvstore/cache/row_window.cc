#include "kvstore/cache/row_window.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"

namespace sluice::kvstore {
namespace {

constexpr int64_t kHeadroom = 64;  // rows

}  // namespace

absl::Status RowWindow::Resize(kernels::Backend& backend, int64_t rows) {
  if (rows < 0) return absl::InvalidArgumentError("a window cannot have fewer than 0 rows");
  if (start_ + rows > capacity_) {
    // A quarter more rows, at least kHeadroom: a window that keeps dropping its oldest rows (a
    // decode's) moves them about once per kHeadroom drops, and a prompt's holds little more
    // than the prompt.
    const int64_t capacity = rows + std::max(kHeadroom, rows / 4);
    if (rows <= capacity_ && rows_ <= start_ && capacity_ <= 2 * capacity) {
      // The buffer holds them from its front, where the live rows are not: they move there,
      // and nothing is allocated (on a device, allocating and freeing each wait for the GPU).
      if (rows_ > 0) {
        SLUICE_RETURN_IF_ERROR(backend.CopyOnDevice(
            {{.dst = Row(0), .src = Row(start_), .bytes = rows_ * row_ * sizeof(float)}}));
      }
      start_ = 0;
      rows_ = rows;
      return absl::OkStatus();
    }
    SLUICE_ASSIGN_OR_RETURN(
        kernels::DeviceBuffer grown,
        kernels::DeviceBuffer::Create(backend, capacity * row_ * sizeof(float)));
    if (rows_ > 0) {
      SLUICE_RETURN_IF_ERROR(backend.CopyOnDevice(
          {{.dst = grown.data(), .src = Row(start_), .bytes = rows_ * row_ * sizeof(float)}}));
    }
    buffer_ = std::move(grown);  // a device backend's free waits for the copy
    start_ = 0;
    capacity_ = capacity;
  }
  rows_ = rows;
  return absl::OkStatus();
}

void RowWindow::DropFront(int64_t n) {
  n = std::min(n, rows_);
  start_ += n;
  rows_ -= n;
  if (rows_ == 0) start_ = 0;
}

absl::StatusOr<RowWindow> RowWindow::Clone(kernels::Backend& backend) const {
  // Exactly the rows it holds: a fork kept as it is (a cached prompt prefix) costs no headroom,
  // and one that goes on writing grows on its first write.
  RowWindow copy(row_);
  if (rows_ > 0) {
    SLUICE_ASSIGN_OR_RETURN(copy.buffer_,
                            kernels::DeviceBuffer::Create(backend, rows_ * row_ * sizeof(float)));
    copy.rows_ = copy.capacity_ = rows_;
  }
  if (rows_ > 0) {
    SLUICE_RETURN_IF_ERROR(backend.CopyOnDevice(
        {{.dst = copy.data(), .src = data(), .bytes = rows_ * row_ * sizeof(float)}}));
  }
  return copy;
}

}  // namespace sluice::kvstore
