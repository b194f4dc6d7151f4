// GGUF reader: round trips of every metadata and tensor type, every truncation of a valid
// file, targeted corruptions, random mutations, and the bundled model file.
#include "model/gguf.h"

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model_path.h"
#include "model/test_util/gguf_writer.h"

namespace sluice::model {
namespace {

using kernels::GgmlType;
using testing::GgufWriter;
using ::testing::HasSubstr;

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * i + 0.1f);
  return v;
}

GgufWriter SampleWriter() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.block_count", 2);
  w.AddInt32("signed", -7);
  w.AddUint64("big", uint64_t{1} << 40);
  w.AddFloat32("llama.rope.freq_base", 10000.f);
  w.AddBool("tokenizer.ggml.add_bos_token", true);
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "<|im_end|>", ""});
  w.AddInt32Array("tokenizer.ggml.token_type", {1, 1, 3, 1});
  w.AddFloat32Array("scores", {0.5f, -1.f});
  w.AddTensorFromFloats("f32", {4, 2}, GgmlType::kF32, Ramp(8, 1.f));
  w.AddTensorFromFloats("f16", {8}, GgmlType::kF16, Ramp(8, 2.f));
  w.AddTensorFromFloats("bf16", {8}, GgmlType::kBF16, Ramp(8, 3.f));
  w.AddTensorFromFloats("q8_0", {64, 2}, GgmlType::kQ8_0, Ramp(128, 1.f));
  w.AddTensorFromFloats("q4_0", {32, 3}, GgmlType::kQ4_0, Ramp(96, 1.f));
  w.AddTensorFromFloats("q4_1", {32, 3}, GgmlType::kQ4_1, Ramp(96, 1.f));
  return w;
}

TEST(Gguf, ReadsEveryMetadataAndTensorType) {
  auto f = GgufFile::FromBytes(SampleWriter().Build());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetInt("llama.block_count"), 2);
  EXPECT_EQ(*g.GetInt("signed"), -7);
  EXPECT_EQ(*g.GetInt("big"), int64_t{1} << 40);
  EXPECT_EQ(*g.GetFloat("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(*g.GetFloat("llama.block_count"), 2.0);
  EXPECT_TRUE(*g.GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_THAT(**g.GetStringArray("tokenizer.ggml.tokens"),
              ::testing::ElementsAre("a", "b", "<|im_end|>", ""));
  EXPECT_THAT(**g.GetIntArray("tokenizer.ggml.token_type"), ::testing::ElementsAre(1, 1, 3, 1));
  EXPECT_THAT(**g.GetFloatArray("scores"), ::testing::ElementsAre(0.5, -1.0));
  EXPECT_EQ(g.keys().size(), 9u);

  EXPECT_EQ(g.GetString("missing").status().code(), absl::StatusCode::kNotFound);
  auto wrong = g.GetString("llama.block_count");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("'llama.block_count' is uint32, expected string"));

  ASSERT_EQ(g.tensors().size(), 6u);
  struct Want {
    const char* name;
    size_t n;
    float scale, tol;
  };
  for (const Want& w : {Want{"f32", 8, 1.f, 0.f}, Want{"f16", 8, 2.f, 2e-3f},
                        Want{"bf16", 8, 3.f, 2e-2f}, Want{"q8_0", 128, 1.f, 1e-2f},
                        Want{"q4_0", 96, 1.f, 0.15f}, Want{"q4_1", 96, 1.f, 0.08f}}) {
    const GgufTensor* t = g.FindTensor(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->num_elements(), static_cast<int64_t>(w.n));
    EXPECT_EQ(t->offset % 32, 0u);
    auto values = g.ToFloat(*t);
    ASSERT_TRUE(values.ok());
    const std::vector<float> want = Ramp(w.n, w.scale);
    for (size_t i = 0; i < w.n; ++i) EXPECT_NEAR((*values)[i], want[i], w.tol) << w.name << i;
  }
  EXPECT_EQ(g.FindTensor("nope"), nullptr);
}

TEST(Gguf, EveryTruncationIsAnErrorNamingAnOffset) {
  const std::string full = SampleWriter().Build();
  ASSERT_TRUE(GgufFile::FromBytes(full).ok());
  // Every prefix shorter than the last tensor's end must fail cleanly.
  const size_t last_end = full.size();
  for (size_t len = 0; len < last_end; ++len) {
    auto f = GgufFile::FromBytes(full.substr(0, len));
    ASSERT_FALSE(f.ok()) << "prefix of " << len << " bytes parsed";
    EXPECT_THAT(f.status().message(),
                ::testing::AnyOf(HasSubstr("offset"), HasSubstr("outside the")))
        << f.status();
  }
}

TEST(Gguf, RejectsCorruptHeadersAndTables) {
  auto err = [](const std::string& bytes) { return GgufFile::FromBytes(bytes).status(); };
  std::string good = SampleWriter().Build();

  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_THAT(err(bad_magic).message(), HasSubstr("not a GGUF file"));

  GgufWriter v1 = SampleWriter();
  EXPECT_EQ(err(v1.Build(/*version=*/1)).code(), absl::StatusCode::kUnimplemented);

  GgufWriter huge_string;
  huge_string.AddRaw("k", GgufType::kString, std::string("\xff\xff\xff\xff\xff\xff\x00\x00", 8));
  EXPECT_THAT(err(huge_string.Build()).message(), HasSubstr("has length"));

  GgufWriter huge_array;
  std::string payload;
  payload.append("\x05\x00\x00\x00", 4);                  // int32 elements
  payload.append("\x00\x00\x00\x00\x00\x00\x00\x10", 8);  // 2^60 of them
  huge_array.AddRaw("arr", GgufType::kArray, payload);
  EXPECT_THAT(err(huge_array.Build()).message(), HasSubstr("claims"));

  GgufWriter bad_type;
  bad_type.AddRaw("k", static_cast<GgufType>(99), "");
  EXPECT_THAT(err(bad_type.Build()).message(), HasSubstr("not a GGUF value type"));

  GgufWriter bad_bool;
  bad_bool.AddRaw("flag", GgufType::kBool, "\x07");
  EXPECT_THAT(err(bad_bool.Build()).message(), HasSubstr("bool 7"));

  GgufWriter dup;
  dup.AddUint32("k", 1);
  dup.AddUint32("k", 2);
  EXPECT_THAT(err(dup.Build()).message(), HasSubstr("appears twice"));

  GgufWriter five_dims;
  five_dims.AddTensor("t", {1, 1, 1, 1, 1}, GgmlType::kF32, std::string(4, '\0'));
  EXPECT_THAT(err(five_dims.Build()).message(), HasSubstr("5 dimensions"));

  GgufWriter unknown_type;
  unknown_type.AddTensor("blk.0.attn_q.weight", {256}, static_cast<GgmlType>(12),
                         std::string(144, '\0'));
  const absl::Status st = err(unknown_type.Build());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(st.message(), HasSubstr("'blk.0.attn_q.weight'"));
  EXPECT_THAT(st.message(), HasSubstr("type 12"));

  GgufWriter ragged;
  ragged.AddTensor("t", {33}, GgmlType::kQ8_0, std::string(68, '\0'));
  EXPECT_THAT(err(ragged.Build()).message(), HasSubstr("not a multiple"));

  GgufWriter bad_align;
  bad_align.AddUint32("general.alignment", 24);
  EXPECT_THAT(err(bad_align.Build()).message(), HasSubstr("power of two"));

  GgufWriter short_data;
  short_data.AddTensor("t", {64}, GgmlType::kF32, std::string(16, '\0'));  // needs 256 bytes
  EXPECT_THAT(err(short_data.Build()).message(), HasSubstr("outside the"));
}

TEST(Gguf, RandomMutationsNeverCrash) {
  const std::string good = SampleWriter().Build();
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  int parsed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = good;
    const int flips = 1 + rng() % 4;
    for (int k = 0; k < flips; ++k) {
      // Header and tables are where lengths live; aim most mutations there.
      const size_t pos = rng() % std::min<size_t>(bytes.size(), rng() % 2 ? 400 : bytes.size());
      bytes[pos] = static_cast<char>(rng());
    }
    auto f = GgufFile::FromBytes(bytes);
    if (f.ok()) {
      ++parsed;
      for (const GgufTensor& t : (*f)->tensors()) ASSERT_TRUE((*f)->ToFloat(t).ok());
    } else {
      EXPECT_FALSE(f.status().message().empty());
    }
  }
  RecordProperty("seed", std::to_string(seed));
  RecordProperty("parsed", parsed);
}

TEST(Gguf, OpenReportsMissingFile) {
  auto f = GgufFile::Open("/nonexistent/model.gguf");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), HasSubstr("/nonexistent/model.gguf"));
}

TEST(Gguf, OpensTheBundledModel) {
  auto f = GgufFile::Open(DefaultModelPath());
  if (f.status().code() == absl::StatusCode::kNotFound) {
    GTEST_SKIP() << "model not fetched (./sluice fetch-model): " << f.status();
  }
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetInt("llama.block_count"), 30);
  EXPECT_EQ(*g.GetInt("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(*g.GetFloat("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ((*g.GetStringArray("tokenizer.ggml.tokens"))->size(), 49152u);
  EXPECT_EQ(g.tensors().size(), 272u);
  const GgufTensor* emb = g.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ8_0);
  EXPECT_THAT(emb->dims, ::testing::ElementsAre(576, 49152));
  const GgufTensor* q = g.FindTensor("blk.7.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::kQ4_1);
  auto norm = g.ToFloat(*g.FindTensor("output_norm.weight"));
  ASSERT_TRUE(norm.ok());
  double sum = 0;
  for (float v : *norm) {
    ASSERT_TRUE(std::isfinite(v));
    sum += std::fabs(v);
  }
  EXPECT_GT(sum / norm->size(), 0.1);  // RMSNorm gains are O(1), not zeros
}

}  // namespace
}  // namespace sluice::model
