// random_gguf: a description keeps the metadata and the tensor list in little space, and a model
// made from it (or from the file) loads, tokenizes and runs like the original's shapes.
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/test_util/gguf_writer.h"
#include "model/test_util/tiny_llama.h"
#include "model/tokenizer.h"
#include "tools/random_gguf_lib.h"

namespace sluice::tools {
namespace {

// The file a writer made from `like` holds.
std::string Bytes(const model::testing::GgufWriter& w, const model::GgufFile& like) {
  return w.Build(like.version(), static_cast<uint32_t>(like.alignment()));
}

// Same names, types and shapes, in order.
void ExpectSameTensors(const model::GgufFile& a, const model::GgufFile& b) {
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
    EXPECT_EQ(a.tensors()[i].type, b.tensors()[i].type) << a.tensors()[i].name;
    EXPECT_EQ(a.tensors()[i].dims, b.tensors()[i].dims) << a.tensors()[i].name;
  }
}

// A forward of a few tokens on the CPU gives finite logits.
void ExpectRuns(const model::GgufFile& file) {
  auto backend = kernels::CpuBackend::Create({.threads = 1});
  ASSERT_TRUE(backend.ok());
  auto llama = model::LlamaModel::Load(file, **backend);
  ASSERT_TRUE(llama.ok()) << llama.status();
  const model::LlamaConfig& c = (*llama)->config();
  auto preset = kvstore::FindKvPreset("fp16", static_cast<int32_t>(c.head_dim));
  ASSERT_TRUE(preset.ok());
  auto cache = kvstore::PagedKvCache::Create({.layers = c.layers,
                                              .heads = c.heads,
                                              .kv_heads = c.kv_heads,
                                              .head_dim = c.head_dim,
                                              .preset = *preset,
                                              .pages = 1024},
                                             **backend);
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_TRUE((*cache)->AddSequence(0, 16).ok());
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  std::vector<float> logits(c.vocab);
  const absl::Status st = (*llama)->Forward({{0, tokens}}, **cache, logits.data());
  ASSERT_TRUE(st.ok()) << st;
  for (size_t i = 0; i < logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i << " is " << logits[i];
  }
}

TEST(RandomGguf, FromADescriptionOfATinyModel) {
  model::testing::TinyLlamaSpec spec;
  spec.tied_output = false;
  auto tiny = model::GgufFile::FromBytes(model::testing::BuildTinyLlamaGguf(spec, 7));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  auto described = DescribeGguf(**tiny);
  ASSERT_TRUE(described.ok()) << described.status();
  auto desc = model::GgufFile::FromBytes(Bytes(*described, **tiny));
  ASSERT_TRUE(desc.ok()) << desc.status();
  EXPECT_TRUE((*desc)->tensors().empty());
  for (const std::string& key : (*tiny)->keys()) {
    ASSERT_NE((*desc)->Find(key), nullptr) << key;
  }
  auto made = RandomGguf(**desc, 3);
  ASSERT_TRUE(made.ok()) << made.status();
  auto random = model::GgufFile::FromBytes(Bytes(*made, **desc));
  ASSERT_TRUE(random.ok()) << random.status();
  EXPECT_EQ((*random)->Find(kDescribedTensorsKey), nullptr);
  ExpectSameTensors(**tiny, **random);
  ExpectRuns(**random);
  // Other seeds, other weights.
  auto other = RandomGguf(**desc, 4);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(Bytes(*other, **desc), Bytes(*made, **desc));
}

TEST(RandomGguf, RefusesAFileWithNothingToMakeTensorsFrom) {
  model::testing::GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddStringArray(kDescribedTensorsKey, {"blk.0.attn_q.weight|2|not,a,shape"});
  auto bad = model::GgufFile::FromBytes(w.Build());
  ASSERT_TRUE(bad.ok());
  const absl::Status st = RandomGguf(**bad, 1).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("blk.0.attn_q.weight"), std::string::npos) << st;
  model::testing::GgufWriter empty;
  empty.AddString("general.architecture", "llama");
  auto none = model::GgufFile::FromBytes(empty.Build());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(RandomGguf(**none, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// The bundled model, where it is: its description is small, and a random model made from it
// has its shapes and its tokenizer.
TEST(RandomGguf, TheBundledModelTravelsAsADescription) {
  const std::string path = model::DefaultModelPath();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no model at " << path;
  auto real = model::GgufFile::Open(path);
  ASSERT_TRUE(real.ok()) << real.status();
  auto described = DescribeGguf(**real);
  ASSERT_TRUE(described.ok()) << described.status();
  const std::string description = Bytes(*described, **real);
  EXPECT_LT(description.size(), size_t{8} << 20);
  auto desc = model::GgufFile::FromBytes(description);
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto made = RandomGguf(**desc, 1);
  ASSERT_TRUE(made.ok()) << made.status();
  auto random = model::GgufFile::FromBytes(Bytes(*made, **desc));
  ASSERT_TRUE(random.ok()) << random.status();
  ExpectSameTensors(**real, **random);
  auto vocab = model::VocabFromGguf(**random);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  auto tokenizer = model::Tokenizer::Create(*std::move(vocab));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto ids = (*tokenizer)->Encode("The river Rhine", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_GT(ids->size(), 0u);
  ExpectRuns(**random);
}

}  // namespace
}  // namespace sluice::tools
