#include "kvstore/wire/kv_wire_codec.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ggml_quant.h"

namespace sluice::kvstore {
namespace {

model::LlamaConfig SmallModel() {
  model::LlamaConfig c;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.rope_dim = 8;
  c.context_length = 512;
  return c;
}

// Rows [n, dim] correlated across channels (a random mix of a few factors) plus noise.
std::vector<float> Rows(int64_t n, int64_t dim, std::mt19937& rng) {
  std::normal_distribution<float> g;
  std::vector<float> mix(4 * dim);
  for (float& x : mix) x = g(rng);
  std::vector<float> rows(n * dim);
  for (int64_t t = 0; t < n; ++t) {
    float f[4];
    for (float& x : f) x = g(rng);
    for (int64_t j = 0; j < dim; ++j) {
      float x = 0.3f * g(rng);
      for (int i = 0; i < 4; ++i) x += f[i] * mix[i * dim + j];
      rows[t * dim + j] = x;
    }
  }
  return rows;
}

// A calibration of SmallModel's shape fitted on random rows, with cross-layer predictors when
// asked.
KvTransformCalibration RandomCalibration(std::mt19937& rng, bool predictors) {
  const model::LlamaConfig m = SmallModel();
  const int32_t dim = static_cast<int32_t>(m.kv_heads * m.head_dim);
  KvTransformCalibration c;
  std::normal_distribution<float> g;
  for (int l = 0; l < m.layers; ++l) {
    for (auto* side : {&c.k, &c.v}) {
      const std::vector<float> rows = Rows(400, dim, rng);
      auto b = FitKvTransformBasis(rows.data(), 400, dim);
      EXPECT_TRUE(b.ok()) << b.status();
      side->push_back(*b);
    }
    for (auto* side : {&c.k_predict, &c.v_predict}) {
      side->emplace_back();
      if (!predictors || l == 0) continue;
      side->back().resize(dim * dim + dim);
      for (float& x : side->back()) x = 0.05f * g(rng);
    }
  }
  return c;
}

struct Coded {
  std::string stream;
  std::vector<std::vector<float>> k, v;  // [layers][tokens * dim]: the encoder's decoded rows
  int64_t fp16_bytes = 0;
};

// Codes layers of random rows in chunks of the given sizes.
Coded Encode(const KvTransformCalibration& cal, const KvWireShape& shape,
             const std::vector<int64_t>& chunks, double bits, std::mt19937& rng,
             std::vector<std::vector<float>>* in_k = nullptr,
             std::vector<std::vector<float>>* in_v = nullptr) {
  const model::LlamaConfig m = SmallModel();
  const int64_t dim = m.kv_heads * m.head_dim;
  auto enc = KvWireEncoder::Create({.calibration = &cal,
                                    .calibration_checksum = KvTransformCalibrationChecksum(cal),
                                    .model = m,
                                    .key_bits = bits,
                                    .value_bits = bits,
                                    .shape = shape});
  EXPECT_TRUE(enc.ok()) << enc.status();
  Coded out;
  std::vector<std::vector<float>> k(m.layers), v(m.layers);
  for (int l = 0; l < m.layers; ++l) {
    k[l] = Rows(shape.tokens, dim, rng);
    v[l] = Rows(shape.tokens, dim, rng);
  }
  out.k.assign(m.layers, std::vector<float>(shape.tokens * dim));
  out.v = out.k;
  int64_t start = 0;
  for (int64_t n : chunks) {
    for (int l = 0; l < m.layers; ++l) {
      const size_t at = start * dim;
      EXPECT_TRUE(enc->Add(l, start, n, k[l].data() + at, v[l].data() + at, out.k[l].data() + at,
                           out.v[l].data() + at)
                      .ok());
    }
    start += n;
  }
  out.fp16_bytes = enc->fp16_bytes();
  auto stream = enc->Finish();
  EXPECT_TRUE(stream.ok()) << stream.status();
  out.stream = *stream;
  if (in_k) *in_k = k;
  if (in_v) *in_v = v;
  return out;
}

TEST(KvWireCodec, DecoderReproducesTheEncodersRowsBitForBit) {
  std::mt19937 rng(std::random_device{}());
  const model::LlamaConfig m = SmallModel();
  const int64_t dim = m.kv_heads * m.head_dim;
  for (bool predictors : {false, true}) {
    const KvTransformCalibration cal = RandomCalibration(rng, predictors);
    const KvWireShape shape{.tokens = 100, .sinks = 4, .tail = 10};
    std::vector<std::vector<float>> in_k, in_v;
    const Coded coded = Encode(cal, shape, {37, 50, 13}, 3, rng, &in_k, &in_v);
    EXPECT_LT(static_cast<int64_t>(coded.stream.size()), coded.fp16_bytes);
    auto dec =
        KvWireDecoder::Open(&cal, KvTransformCalibrationChecksum(cal), "cal", m, coded.stream);
    ASSERT_TRUE(dec.ok()) << dec.status();
    EXPECT_EQ(dec->shape().tokens, 100);
    std::vector<float> k(100 * dim), v(100 * dim);
    for (int l = 0; l < m.layers; ++l) {
      ASSERT_TRUE(dec->DecodeLayer(l, k.data(), v.data()).ok());
      EXPECT_EQ(0, std::memcmp(k.data(), coded.k[l].data(), k.size() * 4)) << "layer " << l;
      EXPECT_EQ(0, std::memcmp(v.data(), coded.v[l].data(), v.size() * 4)) << "layer " << l;
      // Sinks and the tail cross as fp16; the coded rows come close.
      for (int64_t t : {0, 3, 90, 99}) {
        for (int64_t j = 0; j < dim; ++j) {
          const float want = kernels::Fp16ToFloat(kernels::FloatToFp16(in_v[l][t * dim + j]));
          ASSERT_EQ(v[t * dim + j], want) << "layer " << l << " token " << t;
        }
      }
      double err = 0, sum = 0;
      for (int64_t t = 4; t < 90; ++t) {
        for (int64_t j = 0; j < dim; ++j) {
          const double d = k[t * dim + j] - in_k[l][t * dim + j];
          err += d * d;
          sum += double(in_k[l][t * dim + j]) * in_k[l][t * dim + j];
        }
      }
      EXPECT_LT(std::sqrt(err / sum), 0.25) << "layer " << l;
    }
    EXPECT_FALSE(dec->DecodeLayer(m.layers, k.data(), v.data()).ok());
  }
}

TEST(KvWireCodec, MoreBitsCostMoreBytesAndLessError) {
  std::mt19937 rng(std::random_device{}());
  const KvTransformCalibration cal = RandomCalibration(rng, true);
  const KvWireShape shape{.tokens = 200, .sinks = 4, .tail = 0};
  const uint32_t seed = rng();
  std::mt19937 a(seed), b(seed);
  std::vector<std::vector<float>> in_k;
  const Coded low = Encode(cal, shape, {200}, 1.5, a, &in_k);
  const Coded high = Encode(cal, shape, {200}, 6, b);
  EXPECT_LT(low.stream.size(), high.stream.size());
  auto error = [&](const Coded& c) {
    double e = 0;
    for (size_t i = 0; i < in_k[1].size(); ++i) {
      e += (c.k[1][i] - in_k[1][i]) * double(c.k[1][i] - in_k[1][i]);
    }
    return e;
  };
  EXPECT_LT(error(high), error(low));
}

TEST(KvWireCodec, RefusesAnotherCalibrationNamingTheFile) {
  std::mt19937 rng(std::random_device{}());
  const KvTransformCalibration cal = RandomCalibration(rng, false);
  const KvTransformCalibration other = RandomCalibration(rng, false);
  const Coded coded = Encode(cal, {.tokens = 20, .sinks = 4, .tail = 4}, {20}, 2, rng);
  auto dec = KvWireDecoder::Open(&other, KvTransformCalibrationChecksum(other), "/models/x.kvtc",
                                 SmallModel(), coded.stream);
  ASSERT_EQ(dec.status().code(), absl::StatusCode::kFailedPrecondition) << dec.status();
  EXPECT_NE(dec.status().message().find("/models/x.kvtc"), std::string::npos);
}

TEST(KvWireCodec, NamesWhatIsWrongWithAStream) {
  std::mt19937 rng(std::random_device{}());
  const KvTransformCalibration cal = RandomCalibration(rng, true);
  const uint32_t sum = KvTransformCalibrationChecksum(cal);
  const Coded coded = Encode(cal, {.tokens = 30, .sinks = 4, .tail = 4}, {10, 20}, 2, rng);
  const model::LlamaConfig m = SmallModel();
  auto open = [&](const std::string& s) { return KvWireDecoder::Open(&cal, sum, "c", m, s); };
  ASSERT_TRUE(open(coded.stream).ok());
  // Every truncation is refused.
  for (size_t cut = 0; cut < coded.stream.size(); cut += 7) {
    EXPECT_FALSE(open(coded.stream.substr(0, cut)).ok()) << "cut at " << cut;
  }
  EXPECT_FALSE(open(coded.stream + "x").ok());
  std::string s = coded.stream;
  s[4] = 9;  // codec
  EXPECT_NE(open(s).status().message().find("codec 9"), std::string::npos);
  s = coded.stream;
  s[28] = 3;  // chunks
  EXPECT_FALSE(open(s).ok());
  model::LlamaConfig deeper = m;
  deeper.layers = 4;
  EXPECT_FALSE(KvWireDecoder::Open(&cal, sum, "c", deeper, coded.stream).ok());
}

TEST(KvWireCodec, EncoderTakesChunksAndLayersInOrder) {
  std::mt19937 rng(std::random_device{}());
  const KvTransformCalibration cal = RandomCalibration(rng, false);
  const model::LlamaConfig m = SmallModel();
  const int64_t dim = m.kv_heads * m.head_dim;
  const std::vector<float> rows = Rows(20, dim, rng);
  auto enc = KvWireEncoder::Create({.calibration = &cal,
                                    .calibration_checksum = KvTransformCalibrationChecksum(cal),
                                    .model = m,
                                    .shape = {.tokens = 20, .sinks = 4, .tail = 4}});
  ASSERT_TRUE(enc.ok());
  EXPECT_FALSE(enc->Add(1, 0, 10, rows.data(), rows.data()).ok());  // layer 0 first
  EXPECT_FALSE(enc->Add(0, 5, 10, rows.data(), rows.data()).ok());  // from position 0
  ASSERT_TRUE(enc->Add(0, 0, 10, rows.data(), rows.data()).ok());
  EXPECT_FALSE(enc->Add(1, 0, 9, rows.data(), rows.data()).ok());  // the chunk's size
  EXPECT_EQ(enc->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  model::LlamaConfig wider = m;
  wider.kv_heads = 3;
  EXPECT_FALSE(
      KvWireEncoder::Create({.calibration = &cal, .model = wider, .shape = {.tokens = 20}}).ok());
  EXPECT_FALSE(KvWireEncoder::Create(
                   {.calibration = &cal, .model = m, .key_bits = 9, .shape = {.tokens = 20}})
                   .ok());
}

}  // namespace
}  // namespace sluice::kvstore
