#include "kernels/test_util/backend_cases.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace sluice::kernels::testing {

namespace {
constexpr uint32_t kSentinelBits = 0x7fc0dead;  // a NaN no kernel produces by accident

float Sentinel() {
  float f;
  std::memcpy(&f, &kSentinelBits, sizeof(f));
  return f;
}

template <typename T>
absl::StatusOr<std::unique_ptr<Backend>> Upcast(absl::StatusOr<std::unique_ptr<T>> b) {
  if (!b.ok()) return b.status();
  return std::unique_ptr<Backend>(std::move(*b));
}

BackendCase CpuCase(cpu::Isa isa, int threads) {
  return {absl::StrFormat("cpu_%s_%dt", cpu::IsaName(isa), threads),
          [isa, threads] { return Upcast(CpuBackend::Create({.isa = isa, .threads = threads})); }};
}
}  // namespace

std::vector<BackendCase> BackendsUnderTest() {
  std::vector<BackendCase> cases;
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    cases.push_back(CpuCase(isa, 1));
    cases.push_back(CpuCase(isa, 4));
  }
  cases.push_back({"cuda", [] { return Upcast(CudaBackend::Create()); }});
  return cases;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateForOp(const BackendCase& c, Op op) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, c.create());
  if (!backend->Supports(op)) {
    return absl::UnimplementedError(
        absl::StrFormat("%s does not support %s yet", backend->name(), OpName(op)));
  }
  return backend;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                const std::vector<float>& atol, float rtol, const std::string& what) {
  if (got.size() != want.size()) {
    ADD_FAILURE() << what << ": got " << got.size() << " values, want " << want.size();
    return;
  }
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const float tol = (atol.size() == 1 ? atol[0] : atol[i]) + rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << ", want " << want[i]
                    << " (tolerance " << tol << ")";
      ++bad;
    }
  }
}

uint64_t TestSeed() {
  const char* env = std::getenv("SLUICE_TEST_SEED");
  uint64_t seed = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &seed)) return seed;
  return (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
}

std::vector<float> RandomFloats(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

absl::StatusOr<GuardedBuffer> GuardedBuffer::Create(Backend& backend, size_t n) {
  SLUICE_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                          DeviceBuffer::Create(backend, (n + kGuard) * sizeof(float)));
  std::vector<float> fill(n + kGuard, Sentinel());
  SLUICE_RETURN_IF_ERROR(buffer.Upload(fill.data(), fill.size() * sizeof(float)));
  return GuardedBuffer(std::move(buffer), n);
}

absl::Status GuardedBuffer::Upload(const std::vector<float>& values) {
  if (values.size() != n_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d values for a buffer of %d", values.size(), n_));
  }
  return buffer_.Upload(values.data(), n_ * sizeof(float));
}

absl::StatusOr<std::vector<float>> GuardedBuffer::DownloadChecked() const {
  std::vector<float> all(n_ + kGuard);
  SLUICE_RETURN_IF_ERROR(buffer_.Download(all.data(), all.size() * sizeof(float)));
  for (size_t i = n_; i < all.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &all[i], sizeof(bits));
    if (bits != kSentinelBits) {
      return absl::DataLossError(
          absl::StrFormat("guard element %d past the %d outputs was overwritten", i - n_, n_));
    }
  }
  all.resize(n_);
  return all;
}

}  // namespace sluice::kernels::testing
