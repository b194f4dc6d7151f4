// Matmul with every weight type on every backend against the scalar reference: random
// quantized blocks (all bit patterns), ragged m/n, k of one and many blocks.
#include "kernels/ref/matmul.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/ggml_quant.h"
#include "kernels/test_util/backend_cases.h"

namespace sluice::kernels {
namespace {

using testing::BackendCase;
using testing::GuardedBuffer;

// Random weights in `type`'s storage layout: scales and raw codes drawn directly, so every
// code value appears.
std::vector<uint8_t> RandomWeights(std::mt19937_64& rng, GgmlType type, int64_t n, int64_t k) {
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(type));
  std::vector<uint8_t> bytes(n * k / t->block_size * t->type_size);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f), value(-1.f, 1.f);
  auto put16 = [&](size_t at, uint16_t v) { std::memcpy(&bytes[at], &v, 2); };
  for (size_t b = 0; b < bytes.size() / t->type_size; ++b) {
    const size_t at = b * t->type_size;
    switch (type) {
      case GgmlType::kF32: {
        const float v = value(rng);
        std::memcpy(&bytes[at], &v, 4);
        break;
      }
      case GgmlType::kF16:
        put16(at, FloatToFp16(value(rng)));
        break;
      case GgmlType::kBF16: {
        const float v = value(rng);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        put16(at, static_cast<uint16_t>(bits >> 16));
        break;
      }
      case GgmlType::kQ4_1:
        put16(at + 2, FloatToFp16(-8 * scale(rng)));
        [[fallthrough]];
      case GgmlType::kQ4_0:
      case GgmlType::kQ8_0:
        put16(at, FloatToFp16(scale(rng)));
        for (size_t j = (type == GgmlType::kQ4_1 ? 4 : 2); j < size_t(t->type_size); ++j) {
          bytes[at + j] = static_cast<uint8_t>(rng());
        }
        break;
    }
  }
  return bytes;
}

class MatmulTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    auto backend = testing::CreateForOp(GetParam(), Op::kMatmul);
    if (!backend.ok()) GTEST_SKIP() << GetParam().name << " skipped: " << backend.status();
    backend_ = std::move(*backend);
  }

  // `precision` kBf16 allows bf16 rounding of both operands (2^-9 relative each, to nearest).
  // With `accumulate`, y starts random and the product is added to it.
  void Check(GgmlType type, int64_t m, int64_t n, int64_t k, uint64_t seed,
             MatmulPrecision precision = MatmulPrecision::kFp32, bool accumulate = false,
             MatmulRows rows = MatmulRows::kFew) {
    SCOPED_TRACE(::testing::Message()
                 << backend_->name() << " " << GgmlTypeName(uint32_t(type)) << " m=" << m
                 << " n=" << n << " k=" << k << " seed=" << seed << " accumulate=" << accumulate
                 << " rows=" << (rows == MatmulRows::kMany ? "many" : "few"));
    std::mt19937_64 rng(seed);
    std::vector<float> x = testing::RandomFloats(rng, m * k, -2.f, 2.f);
    std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
    const std::vector<float> prior =
        accumulate ? testing::RandomFloats(rng, m * n, -4.f, 4.f) : std::vector<float>();
    std::vector<float> want = accumulate ? prior : std::vector<float>(m * n), bound(m * n);
    ref::Matmul({.x = x.data(),
                 .w = w.data(),
                 .w_type = type,
                 .y = want.data(),
                 .m = m,
                 .n = n,
                 .k = k,
                 .accumulate = accumulate});
    // Error bound from the magnitudes: |x| times |w| (dequantized in double by ref as well).
    std::vector<float> wf(n * k), absx(m * k);
    const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(type));
    for (int64_t j = 0; j < n; ++j) {
      DequantizeRow(type, w.data() + j * (k / t->block_size * t->type_size), wf.data() + j * k, k);
    }
    for (float& v : wf) v = std::fabs(v);
    for (int64_t i = 0; i < m * k; ++i) absx[i] = std::fabs(x[i]);
    ref::Matmul({.x = absx.data(),
                 .w = wf.data(),
                 .w_type = GgmlType::kF32,
                 .y = bound.data(),
                 .m = m,
                 .n = n,
                 .k = k});
    const float rel = precision == MatmulPrecision::kBf16 ? 4.5e-3f : 2e-6f;
    for (float& b : bound) b = rel * b + 1e-6f;
    // The sum's rounding against the prior's magnitude.
    for (size_t i = 0; i < prior.size(); ++i) bound[i] += 2e-7f * std::fabs(prior[i]);

    auto xb = GuardedBuffer::Create(*backend_, x.size());
    auto wb = backend_->Allocate(w.size());
    auto yb = GuardedBuffer::Create(*backend_, want.size());
    ASSERT_TRUE(xb.ok() && wb.ok() && yb.ok());
    ASSERT_TRUE(xb->Upload(x).ok());
    if (accumulate) {
      ASSERT_TRUE(yb->Upload(prior).ok());
    }
    ASSERT_TRUE(backend_->CopyToDevice(*wb, w.data(), w.size()).ok());
    const absl::Status st = backend_->Matmul({.x = xb->data(),
                                              .w = *wb,
                                              .w_type = type,
                                              .y = yb->data(),
                                              .m = m,
                                              .n = n,
                                              .k = k,
                                              .precision = precision,
                                              .accumulate = accumulate,
                                              .rows = rows});
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE(backend_->Synchronize().ok());
    auto got = yb->DownloadChecked();
    backend_->Free(*wb);
    ASSERT_TRUE(got.ok()) << got.status();
    testing::ExpectNear(*got, want, bound, 0.f, "matmul");
  }

  std::unique_ptr<Backend> backend_;
};

TEST_P(MatmulTest, EveryWeightTypeMatchesReference) {
  std::mt19937_64 rng(testing::TestSeed());
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                        GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    for (MatmulRows rows : {MatmulRows::kFew, MatmulRows::kMany}) {
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 32},
                             {1, 37, 576},
                             {3, 16, 64},
                             {4, 20, 96},
                             {7, 33, 160},
                             {17, 50, 1536},
                             {45, 130, 64}}) {
        Check(type, m, n, k, rng(), MatmulPrecision::kFp32, /*accumulate=*/false, rows);
      }
    }
  }
}

// A row's result is the same bits whatever batch it is in (MatmulRows): the rows of one product
// computed again in a batch of another size, at other places, beside other rows, for each kind
// of call, weight type and accumulation. Host backends; the CUDA backend picks its kernel by m.
TEST_P(MatmulTest, RowsDoNotDependOnTheirBatch) {
  if (backend_->memory_space() != MemorySpace::kHost) {
    GTEST_SKIP() << backend_->name() << " picks its kernel by m: not batch-invariant";
  }
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t n = 150;
  for (auto [type, k] : {std::pair{GgmlType::kF32, int64_t{64}},
                         {GgmlType::kF32, 576},
                         {GgmlType::kBF16, 576},
                         {GgmlType::kQ8_0, 1536},
                         {GgmlType::kQ4_1, 576},
                         {GgmlType::kQ4_1, 64}}) {
    const std::vector<uint8_t> w = RandomWeights(rng, type, n, k);
    for (MatmulRows rows : {MatmulRows::kFew, MatmulRows::kMany}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << backend_->name() << " " << GgmlTypeName(uint32_t(type)) << " k=" << k
                     << " rows=" << (rows == MatmulRows::kMany ? "many" : "few")
                     << " accumulate=" << accumulate);
        const auto run = [&](const std::vector<float>& x, std::vector<float> y) {
          const int64_t m = static_cast<int64_t>(x.size()) / k;
          EXPECT_TRUE(backend_
                          ->Matmul({.x = x.data(),
                                    .w = w.data(),
                                    .w_type = type,
                                    .y = y.data(),
                                    .m = m,
                                    .n = n,
                                    .k = k,
                                    .accumulate = accumulate,
                                    .rows = rows})
                          .ok());
          return y;
        };
        // The first batch: m1 rows; then batches of other sizes holding some of its rows.
        // Up to 300 rows: the BLAS path's whole groups of 16 rows and its padded last rows.
        const int64_t m1 = std::uniform_int_distribution<int64_t>(1, 300)(rng);
        const std::vector<float> x1 = testing::RandomFloats(rng, m1 * k, -2.f, 2.f);
        const std::vector<float> y1_prior = testing::RandomFloats(rng, m1 * n, -4.f, 4.f);
        const std::vector<float> y1 = run(x1, y1_prior);
        for (int trial = 0; trial < 3; ++trial) {
          const int64_t m2 = std::uniform_int_distribution<int64_t>(1, 300)(rng);
          std::vector<float> x2 = testing::RandomFloats(rng, m2 * k, -2.f, 2.f);
          std::vector<float> y2_prior = testing::RandomFloats(rng, m2 * n, -4.f, 4.f);
          std::vector<int64_t> from(m2, -1);  // row of batch 1 at each row of batch 2, or -1
          for (int64_t i = 0; i < m2; ++i) {
            if (rng() % 2 == 0) continue;
            from[i] = std::uniform_int_distribution<int64_t>(0, m1 - 1)(rng);
            std::copy_n(x1.begin() + from[i] * k, k, x2.begin() + i * k);
            std::copy_n(y1_prior.begin() + from[i] * n, n, y2_prior.begin() + i * n);
          }
          const std::vector<float> y2 = run(x2, y2_prior);
          for (int64_t i = 0; i < m2; ++i) {
            if (from[i] < 0) continue;
            for (int64_t j = 0; j < n; ++j) {
              ASSERT_EQ(y2[i * n + j], y1[from[i] * n + j])
                  << "row " << from[i] << " of " << m1 << " again as row " << i << " of " << m2
                  << ", column " << j;
            }
          }
        }
      }
    }
  }
}

// The serving path: bf16 operands on backends with bf16 matrix units, fp32 elsewhere.
TEST_P(MatmulTest, Bf16PrecisionStaysWithinBf16Rounding) {
  std::mt19937_64 rng(testing::TestSeed());
  for (GgmlType type : {GgmlType::kF32, GgmlType::kBF16, GgmlType::kQ4_1}) {
    for (auto [m, n, k] :
         {std::tuple<int64_t, int64_t, int64_t>{1, 37, 576}, {7, 33, 160}, {64, 96, 1536}}) {
      Check(type, m, n, k, rng(), MatmulPrecision::kBf16);
    }
  }
}

// Decode-step shapes against bf16 weights: CUDA's skinny kernel (1-16 rows of x, k a multiple of
// 8; 8 rows a pass, 4 output features a warp, so n and m off those multiples too) and cuBLAS
// past it (17 rows) or off its alignment (k = 36: rows of x 144 bytes apart).
TEST_P(MatmulTest, FewRowsAgainstBf16Weights) {
  std::mt19937_64 rng(testing::TestSeed());
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 8},
                         {1, 192, 576},
                         {2, 37, 576},
                         {5, 7, 264},
                         {8, 576, 1536},
                         {9, 13, 64},
                         {16, 1536, 576},
                         {17, 50, 576},
                         {3, 21, 36}}) {
    Check(GgmlType::kBF16, m, n, k, rng(), MatmulPrecision::kBf16);
    Check(GgmlType::kBF16, m, n, k, rng(), MatmulPrecision::kBf16, /*accumulate=*/true);
  }
}

// y += x w^T on every path: quantized dot, tiles and BLAS panels (kMany; a padded last block
// of rows too), bf16.
TEST_P(MatmulTest, AccumulatesIntoY) {
  std::mt19937_64 rng(testing::TestSeed());
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_1}) {
    for (MatmulRows rows : {MatmulRows::kFew, MatmulRows::kMany}) {
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 37, 576},
                             {4, 20, 96},
                             {7, 33, 160},
                             {17, 50, 1536},
                             {40, 140, 64}}) {
        Check(type, m, n, k, rng(), MatmulPrecision::kFp32, /*accumulate=*/true, rows);
      }
    }
    Check(type, 7, 33, 160, rng(), MatmulPrecision::kBf16, /*accumulate=*/true);
  }
}

TEST_P(MatmulTest, OddKForUnblockedTypes) {
  std::mt19937_64 rng(testing::TestSeed());
  Check(GgmlType::kF32, 5, 9, 13, rng());
  Check(GgmlType::kF16, 6, 4, 7, rng());
}

TEST_P(MatmulTest, RejectsKNotMultipleOfBlock) {
  float x[40] = {}, y[1];
  uint8_t w[40] = {};
  const absl::Status st = backend_->Matmul(
      {.x = x, .w = w, .w_type = GgmlType::kQ4_1, .y = y, .m = 1, .n = 1, .k = 40});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block size"), absl::string_view::npos) << st;
}

INSTANTIATE_TEST_SUITE_P(AllBackends, MatmulTest, ::testing::ValuesIn(testing::BackendsUnderTest()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::kernels
