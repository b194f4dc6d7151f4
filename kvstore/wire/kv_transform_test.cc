#include "kvstore/wire/kv_transform.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ggml_quant.h"
#include "kvstore/wire/byte_io.h"
#include "kvstore/wire/rans.h"

namespace sluice::kvstore {
namespace {

// n rows of dim values with variance 4^-i along a random rotation's i-th direction, plus an
// offset: strongly correlated, as keys and values are.
std::vector<float> CorrelatedRows(int64_t n, int dim, std::mt19937& rng,
                                  std::vector<std::vector<double>>* directions = nullptr) {
  std::normal_distribution<double> g;
  // A random orthonormal basis by Gram-Schmidt.
  std::vector<std::vector<double>> q(dim, std::vector<double>(dim));
  for (int i = 0; i < dim; ++i) {
    for (double& x : q[i]) x = g(rng);
    for (int k = 0; k < i; ++k) {
      const double d = std::inner_product(q[i].begin(), q[i].end(), q[k].begin(), 0.0);
      for (int j = 0; j < dim; ++j) q[i][j] -= d * q[k][j];
    }
    const double norm = std::sqrt(std::inner_product(q[i].begin(), q[i].end(), q[i].begin(), 0.0));
    for (double& x : q[i]) x /= norm;
  }
  std::vector<float> rows(n * dim);
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < dim; ++j) rows[t * dim + j] = 0.5f * static_cast<float>(j % 3);
    for (int i = 0; i < dim; ++i) {
      const double a = g(rng) * std::pow(0.5, i);
      for (int j = 0; j < dim; ++j) rows[t * dim + j] += static_cast<float>(a * q[i][j]);
    }
  }
  if (directions) *directions = q;
  return rows;
}

double RelativeError(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (x[i] - y[i]) * double(x[i] - y[i]);
    s += x[i] * double(x[i]);
  }
  return std::sqrt(e / s);
}

TEST(KvTransform, BasisFindsTheDirectionsAndVariances) {
  std::mt19937 rng(std::random_device{}());
  constexpr int kDim = 12;
  std::vector<std::vector<double>> q;
  const std::vector<float> rows = CorrelatedRows(20000, kDim, rng, &q);
  auto b = FitKvTransformBasis(rows.data(), 20000, kDim);
  ASSERT_TRUE(b.ok()) << b.status();
  for (int i = 0; i < kDim; ++i) {
    EXPECT_NEAR(b->variance[i], std::pow(0.25, i), 0.05 * std::pow(0.25, i) + 1e-6) << i;
    if (i > 0) EXPECT_GE(b->variance[i - 1], b->variance[i]);
    double norm = 0, along = 0;
    for (int j = 0; j < kDim; ++j) {
      EXPECT_EQ(b->encode[i * kDim + j], b->decode[i * kDim + j]);  // no metric: orthonormal
      norm += b->encode[i * kDim + j] * double(b->encode[i * kDim + j]);
      along += b->encode[i * kDim + j] * q[i][j];
    }
    EXPECT_NEAR(norm, 1.0, 1e-5);
    if (i < 4) EXPECT_NEAR(std::fabs(along), 1.0, 0.01) << "direction " << i;
  }
  for (int j = 0; j < kDim; ++j) EXPECT_NEAR(b->mean[j], 0.5 * (j % 3), 0.02);
}

// Under a metric the coefficients measure error as the metric does: decode inverts encode, and
// at equal bits the weighted error is lower than the plain basis gives, the plain error higher.
TEST(KvTransform, AMetricMovesTheErrorWhereItMattersLess) {
  std::mt19937 rng(std::random_device{}());
  constexpr int kDim = 10;
  const std::vector<float> calib = CorrelatedRows(5000, kDim, rng);
  // The last coordinates weigh 100x: a metric like W_o^T W_o with a few strong inputs.
  std::vector<double> metric(kDim * kDim, 0.0);
  for (int i = 0; i < kDim; ++i) metric[i * kDim + i] = i >= kDim - 3 ? 100.0 : 1.0;
  auto plain = FitKvTransformBasis(calib.data(), 5000, kDim);
  auto weighted = FitKvTransformBasis(calib.data(), 5000, kDim, metric);
  ASSERT_TRUE(plain.ok() && weighted.ok()) << weighted.status();
  for (int i = 0; i < kDim; ++i) {
    for (int j = 0; j < kDim; ++j) {
      double dot = 0;
      for (int k = 0; k < kDim; ++k)
        dot += weighted->encode[i * kDim + k] * weighted->decode[j * kDim + k];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-4) << i << " " << j;
    }
  }
  const std::vector<float> rows = CorrelatedRows(400, kDim, rng);
  double err[2][2] = {};  // [basis][plain, weighted]
  for (int which = 0; which < 2; ++which) {
    const KvTransformBasis& b = which == 0 ? *plain : *weighted;
    auto block = EncodeKvTransformBlock(b, rows.data(), 400, 2.0);
    ASSERT_TRUE(block.ok());
    std::vector<float> out(rows.size());
    ASSERT_TRUE(DecodeKvTransformBlock(b, *block, out.data(), 400).ok());
    for (size_t i = 0; i < rows.size(); ++i) {
      const double e2 = (out[i] - rows[i]) * double(out[i] - rows[i]);
      err[which][0] += e2;
      err[which][1] += e2 * metric[(i % kDim) * kDim + i % kDim];
    }
  }
  EXPECT_LT(err[1][1], err[0][1]);
  EXPECT_GT(err[1][0], err[0][0]);
  std::vector<double> bad(kDim * kDim - 1, 1.0);
  EXPECT_EQ(FitKvTransformBasis(calib.data(), 5000, kDim, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvTransform, BadCalibrationRowsAreRefused) {
  std::vector<float> rows(8, 1.f);
  EXPECT_EQ(FitKvTransformBasis(rows.data(), 1, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  rows[3] = std::nanf("");
  EXPECT_EQ(FitKvTransformBasis(rows.data(), 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvTransform, BitsGoWhereTheVarianceIs) {
  const std::vector<double> var = {16, 4, 1, 0.25, 0.0625, 0.001, 0};
  const std::vector<uint8_t> bits = AllocateKvTransformBits(var, 2.0);
  EXPECT_EQ(std::accumulate(bits.begin(), bits.end(), 0), 14);
  for (size_t i = 1; i < bits.size(); ++i) EXPECT_GE(bits[i - 1], bits[i]) << i;
  EXPECT_EQ(bits.back(), 0);  // no variance, no bits
  // One more bit for 4x the variance at high rate (reverse water-filling).
  EXPECT_EQ(bits[0] - bits[1], 1);
  const std::vector<uint8_t> capped = AllocateKvTransformBits({1.0}, 20);
  EXPECT_EQ(capped[0], kMaxKvTransformBits);
}

// The decoder against a direct computation of what the codes mean: every coefficient of the
// decoded rows is its component's block mean plus a whole number of the block's one step, the
// step nearest the coefficient of the rows coded; the encoder's own reconstruction is the
// decoder's, bit for bit; more bits give less error.
TEST(KvTransform, BlocksRoundTripAtEveryBudget) {
  std::mt19937 rng(std::random_device{}());
  constexpr int kDim = 16;
  const std::vector<float> calib = CorrelatedRows(4000, kDim, rng);
  auto basis = FitKvTransformBasis(calib.data(), 4000, kDim);
  ASSERT_TRUE(basis.ok());
  const int64_t n = 1 + rng() % 300;
  const std::vector<float> rows = CorrelatedRows(n, kDim, rng);
  double last = 1e9;
  for (double budget : {0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0}) {
    auto block = EncodeKvTransformBlock(*basis, rows.data(), n, budget);
    ASSERT_TRUE(block.ok()) << block.status();
    ASSERT_EQ(*KvTransformBlockTokens(*block), n);
    std::vector<float> out(n * kDim);
    ASSERT_TRUE(DecodeKvTransformBlock(*basis, *block, out.data(), n).ok());
    std::vector<float> again = rows;
    auto same = EncodeKvTransformBlock(*basis, again.data(), n, budget, again.data());
    ASSERT_TRUE(same.ok());
    EXPECT_EQ(*same, *block);
    EXPECT_EQ(0, std::memcmp(again.data(), out.data(), out.size() * sizeof(float))) << budget;
    const double err = RelativeError(rows, out);
    EXPECT_LE(err, last * 1.02) << budget;
    last = std::min(last, err);
    // The header: the step (f32 at 16), then per component its class (0xff: not coded) and mean.
    float step = 0;
    std::memcpy(&step, block->data() + 16, 4);
    ASSERT_GT(step, 0.f);
    for (int i = 0; i < kDim; ++i) {
      const unsigned char* f = reinterpret_cast<const unsigned char*>(block->data()) + 20 + 3 * i;
      uint16_t mean16;
      std::memcpy(&mean16, f + 1, 2);
      const double mean = kernels::Fp16ToFloat(mean16);
      for (int64_t t = 0; t < n; ++t) {
        double c = 0, d = 0;
        for (int j = 0; j < kDim; ++j) {
          c += basis->encode[i * kDim + j] * double(rows[t * kDim + j] - basis->mean[j]);
          d += basis->encode[i * kDim + j] * double(out[t * kDim + j] - basis->mean[j]);
        }
        const double tol = 1e-4 * (1 + std::fabs(c));
        const double q = (d - mean) / step;
        ASSERT_NEAR(q, std::round(q), 1e-2 + tol / step) << "component " << i << " token " << t;
        if (f[0] == 0xff) {
          ASSERT_NEAR(q, 0, 1e-2 + tol / step) << "component " << i << " is sent as its mean";
        }
        ASSERT_LE(std::fabs(d - c), 0.5 * step + tol) << "component " << i << " token " << t;
      }
    }
  }
  EXPECT_LT(last, 0.02);
}

// The step is chosen so that the codes cost about the budget, fractions of a bit included.
TEST(KvTransform, CodesSpendTheBudget) {
  std::mt19937 rng(std::random_device{}());
  constexpr int kDim = 32;
  const std::vector<float> calib = CorrelatedRows(4000, kDim, rng);
  auto basis = FitKvTransformBasis(calib.data(), 4000, kDim);
  ASSERT_TRUE(basis.ok());
  constexpr int64_t kRows = 2048;
  const std::vector<float> rows = CorrelatedRows(kRows, kDim, rng);
  for (double budget : {0.25, 0.75, 1.5, 3.0, 5.0}) {
    auto block = EncodeKvTransformBlock(*basis, rows.data(), kRows, budget);
    ASSERT_TRUE(block.ok()) << block.status();
    // The codes' stream follows the header, the components and the classes' tables.
    ByteReader r(*block);
    std::string_view skipped;
    ASSERT_TRUE(r.Skip(14, &skipped));
    uint8_t classes = 0;
    ASSERT_TRUE(r.Take(&classes, 1));
    ASSERT_TRUE(r.Skip(5 + 3 * kDim, &skipped));
    for (int k = 0; k < classes; ++k) {
      uint8_t shift = 0;
      ASSERT_TRUE(r.Take(&shift, 1));
      ASSERT_TRUE(ReadRansTable(r, "table").ok());
    }
    uint32_t stream = 0;
    ASSERT_TRUE(r.Take(&stream, 4));
    ASSERT_EQ(r.left(), stream);
    const double bits = 8.0 * stream / (kRows * kDim);
    EXPECT_NEAR(bits, budget, 0.1 * budget + 0.02) << "budget " << budget;
  }
}

TEST(KvTransform, BadBlocksGiveErrorsNamingWhatIsWrong) {
  std::mt19937 rng(std::random_device{}());
  constexpr int kDim = 8;
  const std::vector<float> calib = CorrelatedRows(1000, kDim, rng);
  auto basis = FitKvTransformBasis(calib.data(), 1000, kDim);
  ASSERT_TRUE(basis.ok());
  const std::vector<float> rows = CorrelatedRows(50, kDim, rng);
  auto block = EncodeKvTransformBlock(*basis, rows.data(), 50, 3.0);
  ASSERT_TRUE(block.ok());
  std::vector<float> out(50 * kDim);
  // Another calibration's basis.
  const std::vector<float> other_rows = CorrelatedRows(1000, kDim, rng);
  auto other = FitKvTransformBasis(other_rows.data(), 1000, kDim);
  ASSERT_TRUE(other.ok());
  absl::Status s = DecodeKvTransformBlock(*other, *block, out.data(), 50);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("another calibration"), std::string::npos) << s;
  // Too little room.
  EXPECT_EQ(DecodeKvTransformBlock(*basis, *block, out.data(), 49).code(),
            absl::StatusCode::kInvalidArgument);
  // Every truncation is DataLoss (or a header error), never a crash or success.
  for (size_t len = 0; len < block->size(); ++len) {
    s = DecodeKvTransformBlock(*basis, std::string_view(*block).substr(0, len), out.data(), 50);
    EXPECT_FALSE(s.ok()) << len;
  }
  // A byte too many.
  EXPECT_EQ(DecodeKvTransformBlock(*basis, *block + "x", out.data(), 50).code(),
            absl::StatusCode::kDataLoss);
  // Any flipped byte decodes or fails cleanly (ASan and UBSan run this in the fuzz config).
  for (size_t i = 0; i < block->size(); ++i) {
    std::string bad = *block;
    bad[i] = static_cast<char>(bad[i] ^ (1 + rng() % 255));
    (void)DecodeKvTransformBlock(*basis, bad, out.data(), 50);
  }
  // Encoding refuses what it cannot code.
  EXPECT_FALSE(EncodeKvTransformBlock(*basis, rows.data(), 0, 2.0).ok());
  EXPECT_FALSE(EncodeKvTransformBlock(*basis, rows.data(), 50, 0.0).ok());
  EXPECT_FALSE(EncodeKvTransformBlock(*basis, rows.data(), 50, 9.0).ok());
  std::vector<float> nan_rows = rows;
  nan_rows[17] = std::nanf("");
  EXPECT_FALSE(EncodeKvTransformBlock(*basis, nan_rows.data(), 50, 2.0).ok());
}

TEST(KvTransform, CalibrationFilesRoundTripAndCorruptionIsNamed) {
  std::mt19937 rng(std::random_device{}());
  constexpr int kDim = 6;
  KvTransformCalibration c;
  for (int l = 0; l < 3; ++l) {
    const std::vector<float> k = CorrelatedRows(200, kDim, rng), v = CorrelatedRows(200, kDim, rng);
    c.k.push_back(*FitKvTransformBasis(k.data(), 200, kDim));
    c.v.push_back(*FitKvTransformBasis(v.data(), 200, kDim));
  }
  // Without predictors, then with them (layers 1 and 2).
  {
    auto plain = ParseKvTransformCalibration(SerializeKvTransformCalibration(c), "plain.bin");
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_EQ(plain->k_predict.size(), 3u);
    for (const auto& p : plain->k_predict) EXPECT_TRUE(p.empty());
  }
  std::normal_distribution<float> g;
  c.k_predict.assign(3, {});
  c.v_predict.assign(3, {});
  for (int l = 1; l < 3; ++l) {
    for (auto* p : {&c.k_predict[l], &c.v_predict[l]}) {
      p->resize(kDim * kDim + kDim);
      for (float& x : *p) x = g(rng);
    }
  }
  const std::string bytes = SerializeKvTransformCalibration(c);
  auto back = ParseKvTransformCalibration(bytes, "calib.bin");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->k.size(), 3u);
  EXPECT_EQ(back->k_predict, c.k_predict);
  EXPECT_EQ(back->v_predict, c.v_predict);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(back->k[l].checksum, c.k[l].checksum);
    EXPECT_EQ(back->v[l].checksum, c.v[l].checksum);
    EXPECT_EQ(back->v[l].encode, c.v[l].encode);
    EXPECT_EQ(back->v[l].decode, c.v[l].decode);
  }
  std::string bad = bytes;
  bad[100] ^= 1;
  auto s = ParseKvTransformCalibration(bad, "calib.bin").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("calib.bin"), std::string::npos) << s;
  EXPECT_EQ(ParseKvTransformCalibration(bytes.substr(0, bytes.size() - 1), "c").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseKvTransformCalibration("not a calibration file", "c").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kvstore
