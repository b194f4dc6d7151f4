// The transform-coded wire end to end without a model: a prefill-side cache codes a prompt as
// it is written in chunks; a decode-side cache commits the decoded rows; both hold the same KV.
#include "kvstore/wire/wire_encoding_kv_cache.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"

namespace sluice::kvstore {
namespace {

model::LlamaConfig Model() {
  model::LlamaConfig c;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 1;
  c.head_dim = 32;
  c.rope_dim = 32;
  c.context_length = 512;
  return c;
}
constexpr int64_t kDim = 32;  // kv_heads * head_dim

std::vector<float> Random(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> g;
  std::vector<float> x(n);
  for (float& v : x) v = g(rng);
  return x;
}

KvTransformCalibration Calibration(std::mt19937& rng) {
  KvTransformCalibration c;
  for (int l = 0; l < Model().layers; ++l) {
    for (auto* side : {&c.k, &c.v}) {
      const std::vector<float> rows = Random(rng, 300 * kDim);
      auto b = FitKvTransformBasis(rows.data(), 300, kDim);
      EXPECT_TRUE(b.ok()) << b.status();
      side->push_back(*b);
    }
  }
  return c;
}

std::unique_ptr<PagedKvCache> MakeCache(kernels::Backend& backend, std::string_view preset) {
  const model::LlamaConfig m = Model();
  auto p = FindKvPreset(preset, static_cast<int32_t>(m.head_dim));
  EXPECT_TRUE(p.ok()) << p.status();
  auto c = PagedKvCache::Create({.layers = m.layers,
                                 .heads = m.heads,
                                 .kv_heads = m.kv_heads,
                                 .head_dim = m.head_dim,
                                 .preset = *p,
                                 .pages = 256},
                                backend);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

// The prompt's chunks written and committed as a prefill does (its attention aside).
void Prefill(model::KvCache& cache, int64_t seq, const std::vector<int64_t>& chunks,
             std::mt19937& rng) {
  for (int64_t n : chunks) {
    ASSERT_TRUE(cache.BeginStep({{.seq = seq, .tokens = n}}).ok());
    for (int l = 0; l < Model().layers; ++l) {
      const std::vector<float> k = Random(rng, n * kDim), v = Random(rng, n * kDim);
      ASSERT_TRUE(cache.Write(l, k.data(), v.data()).ok());
      ASSERT_TRUE(cache.LayerDone(l).ok());
    }
    ASSERT_TRUE(cache.Commit().ok());
  }
}

// One more token through every layer of `seq`: the attention outputs, [layers][heads * dim].
// Two caches that hold the same KV answer alike, bit for bit.
std::vector<float> AttendOnce(PagedKvCache& cache, int64_t seq, uint32_t seed) {
  std::mt19937 rng(seed);
  const model::LlamaConfig m = Model();
  std::vector<float> outs;
  EXPECT_TRUE(cache.BeginStep({{.seq = seq, .tokens = 1}}).ok());
  for (int l = 0; l < m.layers; ++l) {
    const std::vector<float> k = Random(rng, kDim), v = Random(rng, kDim);
    const std::vector<float> q = Random(rng, m.heads * m.head_dim);
    std::vector<float> out(m.heads * m.head_dim);
    EXPECT_TRUE(cache.Write(l, k.data(), v.data()).ok());
    EXPECT_TRUE(cache.Attend(l, q.data(), out.data()).ok());
    outs.insert(outs.end(), out.begin(), out.end());
  }
  EXPECT_TRUE(cache.Commit().ok());
  return outs;
}

TEST(WireEncodingKvCache, TheDecodeSideHoldsWhatTheWireDelivered) {
  std::mt19937 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  const KvTransformCalibration cal = Calibration(rng);
  const uint32_t sum = KvTransformCalibrationChecksum(cal);
  constexpr int64_t kTokens = 150;
  for (const char* preset : {"fp16", "sluice", "kivi2", "int8", "kvcomp"}) {
    SCOPED_TRACE(preset);
    std::unique_ptr<PagedKvCache> prefill = MakeCache(**cpu, preset);
    WireEncodingKvCache wire(prefill.get(), WireEncodingKvCache::Pass::kDecoded);
    ASSERT_TRUE(wire.AddSequence(7, 200).ok());
    const int64_t tail = prefill->WindowAfterPrompt(kTokens);
    ASSERT_TRUE(wire.StartEncoding(7, {.calibration = &cal,
                                       .calibration_checksum = sum,
                                       .model = Model(),
                                       .key_bits = 3,
                                       .value_bits = 3,
                                       .shape = {.tokens = kTokens, .sinks = 4, .tail = tail}})
                    .ok());
    // Two chunks cut where the CPU kernels' vector loops cut the single step the decode side
    // commits (multiples of 8 tokens, the same remainder): their scalar remainders round
    // differently, and the comparison below is bit for bit.
    Prefill(wire, 7, {64, 86}, rng);
    EXPECT_EQ(wire.EncodedFp16Bytes(7), kTokens * kDim * 2 * 2 * Model().layers);
    auto stream = wire.FinishEncoding(7);
    ASSERT_TRUE(stream.ok()) << stream.status();
    // 3 bits a value: well under a third of fp16 where nothing is kept exact but the sinks.
    if (tail == 0) {
      EXPECT_LT(static_cast<int64_t>(stream->size()), kTokens * kDim * 2 * 2 * Model().layers / 3);
    }

    std::unique_ptr<PagedKvCache> decode = MakeCache(**cpu, preset);
    auto dec = KvWireDecoder::Open(&cal, sum, "cal", Model(), *stream);
    ASSERT_TRUE(dec.ok()) << dec.status();
    ASSERT_TRUE(decode
                    ->AddSequenceFromRows(
                        3, 200, kTokens,
                        [&](int l, float* k, float* v) { return dec->DecodeLayer(l, k, v); })
                    .ok());
    EXPECT_EQ(decode->Length(3).value_or(-1), kTokens);
    // The same KV: the same window, and attention over it answers alike (up to the order of
    // float sums, which follows where each cache's window rows sit).
    EXPECT_EQ(decode->Stats().residual_tokens, tail * Model().layers);

    EXPECT_EQ(prefill->Stats().held_bytes(), decode->Stats().held_bytes());
    const uint32_t seed = rng();
    const std::vector<float> a = AttendOnce(*prefill, 7, seed), b = AttendOnce(*decode, 3, seed);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::fabs(a[i]))) << i;
  }
}

TEST(WireEncodingKvCache, TheWrappedCacheGetsTheComputedRowsWhenAsked) {
  std::mt19937 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  const KvTransformCalibration cal = Calibration(rng);
  std::unique_ptr<PagedKvCache> plain = MakeCache(**cpu, "fp16");
  std::unique_ptr<PagedKvCache> coded = MakeCache(**cpu, "fp16");
  WireEncodingKvCache wire(coded.get(), WireEncodingKvCache::Pass::kComputed);
  ASSERT_TRUE(plain->AddSequence(0, 64).ok());
  ASSERT_TRUE(wire.AddSequence(0, 64).ok());
  ASSERT_TRUE(wire.StartEncoding(0, {.calibration = &cal,
                                     .calibration_checksum = KvTransformCalibrationChecksum(cal),
                                     .model = Model(),
                                     .shape = {.tokens = 40}})
                  .ok());
  const uint32_t seed = rng();
  std::mt19937 a(seed), b(seed);
  Prefill(*plain, 0, {40}, a);
  Prefill(wire, 0, {40}, b);
  EXPECT_TRUE(wire.FinishEncoding(0).ok());
  const uint32_t probe = rng();
  EXPECT_EQ(AttendOnce(*plain, 0, probe), AttendOnce(*coded, 0, probe));
}

TEST(WireEncodingKvCache, AFailedStepEndsTheStreamAndRowsLeaveNothingBehindOnError) {
  std::mt19937 rng(std::random_device{}());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  const KvTransformCalibration cal = Calibration(rng);
  std::unique_ptr<PagedKvCache> cache = MakeCache(**cpu, "sluice");
  WireEncodingKvCache wire(cache.get(), WireEncodingKvCache::Pass::kComputed);
  ASSERT_TRUE(wire.AddSequence(1, 64).ok());
  const KvWireEncoder::Options o{.calibration = &cal,
                                 .calibration_checksum = KvTransformCalibrationChecksum(cal),
                                 .model = Model(),
                                 .shape = {.tokens = 40}};
  ASSERT_TRUE(wire.StartEncoding(1, o).ok());
  EXPECT_EQ(wire.StartEncoding(1, o).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(wire.BeginStep({{.seq = 1, .tokens = 40}}).ok());
  const std::vector<float> k = Random(rng, 40 * kDim);
  ASSERT_TRUE(wire.Write(0, k.data(), k.data()).ok());
  wire.AbortStep();
  EXPECT_EQ(wire.FinishEncoding(1).status().code(), absl::StatusCode::kFailedPrecondition);

  // Rows into a cache: a source that fails, or a preset that selects by attention, leaves no
  // sequence and no page behind.
  const int64_t used = cache->pool().used_pages();
  auto failing = [](int l, float*, float*) {
    return l == 2 ? absl::DataLossError("layer 2 is damaged") : absl::OkStatus();
  };
  EXPECT_EQ(cache->AddSequenceFromRows(5, 300, 200, failing).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(cache->Length(5).ok());
  EXPECT_EQ(cache->pool().used_pages(), used);
  std::unique_ptr<PagedKvCache> snap = MakeCache(**cpu, "snapkv");
  auto fine = [](int, float*, float*) { return absl::OkStatus(); };
  const absl::Status refused = snap->AddSequenceFromRows(5, 300, 200, fine);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("snapkv"), std::string::npos);
  EXPECT_FALSE(snap->Length(5).ok());
}

}  // namespace
}  // namespace sluice::kvstore
