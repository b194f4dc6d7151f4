#include "kvstore/cache/row_window.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"

namespace sluice::kvstore {

absl::Status RowWindow::Resize(kernels::Backend& backend, int64_t rows) {
  if (rows < 0) return absl::InvalidArgumentError("a window cannot have fewer than 0 rows");
  if (start_ + rows > capacity_) {
    // Twice the rows: a window that keeps dropping its oldest rows moves them about once per
    // window's worth of drops, and never holds more than twice what it needs.
    const int64_t capacity = std::max<int64_t>(1, 2 * rows);
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
  RowWindow copy(row_);
  SLUICE_RETURN_IF_ERROR(copy.Resize(backend, rows_));
  if (rows_ > 0) {
    SLUICE_RETURN_IF_ERROR(backend.CopyOnDevice(
        {{.dst = copy.data(), .src = data(), .bytes = rows_ * row_ * sizeof(float)}}));
  }
  return copy;
}

}  // namespace sluice::kvstore
