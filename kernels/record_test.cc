// Backend::Record and Replay: a recording runs its ops again at every replay, on what its
// buffers hold then, as the ops would run issued one by one; ops that cannot be recorded fail the
// recording and run nothing; host backends record nothing.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "kernels/ggml_quant.h"
#include "kernels/test_util/backend_cases.h"
#include "kernels/test_util/op_test.h"

namespace sluice::kernels {
namespace {

class RecordTest : public ::testing::TestWithParam<testing::BackendCase> {
 protected:
  void SetUp() override {
    auto backend = GetParam().create();
    if (!backend.ok()) GTEST_SKIP() << GetParam().name << " skipped: " << backend.status();
    backend_ = std::move(*backend);
  }
  void TearDown() override {
    for (void* p : owned_) backend_->Free(p);
  }
  template <typename T>
  T* Buffer(const std::vector<T>& host) {
    auto d = backend_->Allocate(host.size() * sizeof(T));
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    owned_.push_back(*d);
    EXPECT_TRUE(backend_->CopyToDevice(*d, host.data(), host.size() * sizeof(T)).ok());
    return static_cast<T*>(*d);
  }
  std::vector<float> Read(const float* d, size_t n) {
    std::vector<float> host(n);
    EXPECT_TRUE(backend_->CopyToHost(host.data(), d, n * sizeof(float)).ok());
    return host;
  }

  std::unique_ptr<Backend> backend_;
  std::vector<void*> owned_;
};

// A layer's worth of small ops as a decode step issues them: norm, a projection against bf16
// weights that accumulates (the skinny kernel on CUDA), an activation.
struct Layer {
  float *x, *weight, *h;
  uint16_t* w;
  float *y, *up;
  int64_t rows, dim, out;
};

absl::Status RunLayer(Backend& b, const Layer& l) {
  if (absl::Status st =
          b.RmsNorm({.x = l.x, .weight = l.weight, .y = l.h, .rows = l.rows, .dim = l.dim});
      !st.ok()) {
    return st;
  }
  if (absl::Status st = b.Matmul({.x = l.h,
                                  .w = l.w,
                                  .w_type = GgmlType::kBF16,
                                  .y = l.y,
                                  .m = l.rows,
                                  .n = l.out,
                                  .k = l.dim,
                                  .precision = MatmulPrecision::kBf16,
                                  .accumulate = true});
      !st.ok()) {
    return st;
  }
  return b.SwiGlu({.gate = l.y, .up = l.up, .out = l.y, .n = l.rows * l.out});
}

TEST_P(RecordTest, ReplaysRunTheOpsOnTheBuffersContents) {
  if (!backend_->CanRecord()) {
    auto r = backend_->Record([] { return absl::OkStatus(); });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
    return;
  }
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const int64_t rows = 3, dim = 64, out = 40;
  const std::vector<float> weight = testing::RandomFloats(rng, dim, 0.5f, 1.5f);
  std::vector<uint16_t> w(out * dim);
  for (uint16_t& v : w) v = FloatToBf16(std::uniform_real_distribution<float>(-1.f, 1.f)(rng));
  const std::vector<float> up = testing::RandomFloats(rng, rows * out, -1.f, 1.f);
  const std::vector<float> y0 = testing::RandomFloats(rng, rows * out, -1.f, 1.f);
  // Two copies of every buffer: one for the recording, one for the ops issued directly.
  Layer rec{}, direct{};
  for (Layer* l : {&rec, &direct}) {
    *l = {.x = Buffer(std::vector<float>(rows * dim)),
          .weight = Buffer(weight),
          .h = Buffer(std::vector<float>(rows * dim)),
          .w = Buffer(w),
          .y = Buffer(y0),
          .up = Buffer(up),
          .rows = rows,
          .dim = dim,
          .out = out};
  }
  auto recording = backend_->Record([&] { return RunLayer(*backend_, rec); });
  ASSERT_TRUE(recording.ok()) << recording.status();
  EXPECT_EQ(Read(rec.y, rows * out), y0);  // recorded, not run
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> x = testing::RandomFloats(rng, rows * dim, -2.f, 2.f);
    for (Layer* l : {&rec, &direct}) {
      ASSERT_TRUE(backend_->CopyToDevice(l->x, x.data(), x.size() * sizeof(float)).ok());
    }
    ASSERT_TRUE(backend_->Replay(**recording).ok());
    ASSERT_TRUE(RunLayer(*backend_, direct).ok());
    ASSERT_TRUE(backend_->Synchronize().ok());
    // Same kernels in the same order: bit for bit, the accumulated y included.
    EXPECT_EQ(Read(rec.y, rows * out), Read(direct.y, rows * out)) << "round " << round;
  }
}

TEST_P(RecordTest, OpsThatCannotBeRecordedFailTheRecordingAndRunNothing) {
  if (!backend_->CanRecord()) GTEST_SKIP() << backend_->name() << " records no ops";
  std::vector<float> host(64, 1.f);
  float* d = Buffer(host);
  const auto blocking = [&]() -> std::vector<std::function<absl::Status()>> {
    return {
        [&] { return backend_->Synchronize(); },
        [&] { return backend_->CopyToDevice(d, host.data(), 64 * sizeof(float)); },
        [&] { return backend_->CopyToHost(host.data(), d, 64 * sizeof(float)); },
        [&] { return backend_->Allocate(16).status(); },
    };
  }();
  for (size_t i = 0; i < blocking.size(); ++i) {
    auto r = backend_->Record([&]() -> absl::Status {
      if (absl::Status st = backend_->SwiGlu({.gate = d, .up = d, .out = d, .n = 64}); !st.ok()) {
        return st;
      }
      return blocking[i]();
    });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << i << " " << r.status();
    EXPECT_NE(r.status().message().find("cannot be recorded"), absl::string_view::npos)
        << r.status();
  }
  // Nothing ran (the SwiGLUs were dropped with their recordings), and the backend still works.
  EXPECT_EQ(Read(d, 64), host);
  ASSERT_TRUE(backend_->SwiGlu({.gate = d, .up = d, .out = d, .n = 64}).ok());
  EXPECT_NEAR(Read(d, 64)[0], 1.f / (1.f + std::exp(-1.f)), 1e-6f);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, RecordTest, ::testing::ValuesIn(testing::BackendsUnderTest()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::kernels
