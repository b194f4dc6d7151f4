// A sequence's full-precision window of one layer, in the backend's memory: rows of `row`
// floats (kv_heads x head_dim), the live ones [start, start + rows) of a buffer with a quarter
// more rows (at least 64 more), so that a flush dropping the oldest rows moves nothing and new
// rows move the others about once per 64 dropped, to the front of the same buffer when they fit
// there (a new buffer only when the window outgrows it, or holds less than half of it). On a
// device backend the rows are device memory: only backend ops read and write them.
#ifndef SLUICE_KVSTORE_CACHE_ROW_WINDOW_H_
#define SLUICE_KVSTORE_CACHE_ROW_WINDOW_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/device_buffer.h"

namespace sluice::kvstore {

class RowWindow {
 public:
  explicit RowWindow(int64_t row = 0) : row_(row) {}

  int64_t rows() const { return rows_; }
  int64_t row() const { return row_; }
  int64_t capacity() const { return capacity_; }  // rows the buffer holds
  // The first live row; null while the window has no memory.
  float* data() const { return buffer_.as<float>() == nullptr ? nullptr : Row(start_); }
  // The live rows, in the backend's memory.
  kernels::BufferView<float> view() const {
    kernels::BufferView<float> all = buffer_.view<float>();
    return {.data = data(), .size = rows_ * row_, .space = all.space};
  }

  // Makes the window `rows` long: shrinking drops the newest rows; growing adds rows of
  // unspecified contents after the live ones, moving those (a copy on the backend) into a
  // larger buffer when they do not fit. Pointers into the window hold unless it moves.
  absl::Status Resize(kernels::Backend& backend, int64_t rows);
  // Drops the oldest n rows (n <= rows()).
  void DropFront(int64_t n);
  // A window of the same rows in memory of its own, no larger than they need.
  absl::StatusOr<RowWindow> Clone(kernels::Backend& backend) const;

 private:
  float* Row(int64_t i) const { return buffer_.as<float>() + i * row_; }

  int64_t row_;
  int64_t start_ = 0, rows_ = 0, capacity_ = 0;  // in rows
  kernels::DeviceBuffer buffer_;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_CACHE_ROW_WINDOW_H_
