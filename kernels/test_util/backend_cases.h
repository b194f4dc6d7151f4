// The backends every op test runs against the reference, and the seeded random inputs and
// guarded output buffers those tests share.
#ifndef SLUICE_KERNELS_TEST_UTIL_BACKEND_CASES_H_
#define SLUICE_KERNELS_TEST_UTIL_BACKEND_CASES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/device_buffer.h"

namespace sluice::kernels::testing {

struct BackendCase {
  std::string name;  // a gtest-safe name: "cpu_avx512", "cuda"
  std::function<absl::StatusOr<std::unique_ptr<Backend>>()> create;
};

// Every CPU instruction-set level (single- and multi-threaded) and CUDA. A case whose
// backend this machine cannot run is skipped by the test, with the reason.
std::vector<BackendCase> BackendsUnderTest();

inline std::ostream& operator<<(std::ostream& os, const BackendCase& c) { return os << c.name; }

// The case's backend if it can run `op` here; otherwise an error saying why, for GTEST_SKIP.
absl::StatusOr<std::unique_ptr<Backend>> CreateForOp(const BackendCase& c, Op op);

// Adds a failure (at most five, with indices) for each element where
// |got - want| > atol[i] (or atol[0] if atol has one element) + rtol * |want|.
void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                const std::vector<float>& atol, float rtol, const std::string& what);

// A fresh seed per call unless SLUICE_TEST_SEED is set; tests print it on failure.
uint64_t TestSeed();

std::vector<float> RandomFloats(std::mt19937_64& rng, size_t n, float lo, float hi);

// A device buffer of `n` floats followed by guard elements holding a sentinel pattern, so a
// kernel writing past its output is caught.
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 64;
  static absl::StatusOr<GuardedBuffer> Create(Backend& backend, size_t n);

  float* data() const { return buffer_.as<float>(); }
  // The n values (not the guard elements) as elements of T, in the backend's memory.
  template <typename T = float>
  BufferView<T> view() const {
    const BufferView<T> all = buffer_.view<T>();
    return {.data = all.data,
            .size = static_cast<int64_t>(n_ * sizeof(float) / sizeof(T)),
            .space = all.space};
  }
  absl::Status Upload(const std::vector<float>& values);
  // Reads the `n` values back; fails if any guard element was overwritten.
  absl::StatusOr<std::vector<float>> DownloadChecked() const;

 private:
  GuardedBuffer(DeviceBuffer buffer, size_t n) : buffer_(std::move(buffer)), n_(n) {}
  DeviceBuffer buffer_;
  size_t n_;
};

}  // namespace sluice::kernels::testing

#endif  // SLUICE_KERNELS_TEST_UTIL_BACKEND_CASES_H_
