// The real model against HF transformers loading the same GGUF (tests/reference/goldens):
// identical prompt token ids, last-position logits within max relative error 1e-3, and
// identical 32-token greedy continuations.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/test_util/goldens.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace sluice::model {
namespace {

class LlamaGoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ifstream f(testing::GoldenPath("model_goldens.json"));
    ASSERT_TRUE(f.good()) << "missing " << testing::GoldenPath("model_goldens.json");
    goldens_ = nlohmann::json::parse(f);
    auto gguf = GgufFile::Open(DefaultModelPath());
    if (gguf.status().code() == absl::StatusCode::kNotFound) {
      GTEST_SKIP() << "model not fetched (./sluice fetch-model): " << gguf.status();
    }
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    gguf_ = std::move(*gguf);
    auto vocab = VocabFromGguf(*gguf_);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    auto tok = Tokenizer::Create(std::move(*vocab));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    // One thread: Bazel runs tests side by side on few cores, and oversubscribed OpenMP teams
    // slow to a crawl; this test checks numbers, not speed.
    backend_ = *kernels::CpuBackend::Create({.threads = 1});
    auto model = LlamaModel::Load(*gguf_, *backend_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }

  nlohmann::json goldens_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<kernels::CpuBackend> backend_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(LlamaGoldenTest, MatchesTransformers) {
  const LlamaConfig& c = model_->config();
  ASSERT_GE(goldens_["prompts"].size(), 10u);
  double worst = 0;
  for (const auto& g : goldens_["prompts"]) {
    const std::string name = g["name"];
    SCOPED_TRACE(name);
    const std::vector<int32_t> want_ids = g["prompt_tokens"];
    // Chat prompts were rendered by the template, so their special tokens are real ones.
    const bool special = g.contains("chat_messages");
    auto ids = tokenizer_->Encode(g["text"].get<std::string>(), special);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, want_ids) << "prompt token ids differ";

    std::ifstream lf(testing::GoldenPath(g["logits_file"].get<std::string>()), std::ios::binary);
    std::vector<float> want(c.vocab);
    ASSERT_TRUE(lf.read(reinterpret_cast<char*>(want.data()), want.size() * 4))
        << "cannot read " << g["logits_file"];

    // fp16 pages with no residual window: every token of the greedy continuation attends over
    // compressed pages, as in serving.
    auto preset = kvstore::FindKvPreset("fp16", static_cast<int32_t>(c.head_dim));
    ASSERT_TRUE(preset.ok());
    auto cache_or = kvstore::PagedKvCache::Create({.layers = c.layers,
                                                   .heads = c.heads,
                                                   .kv_heads = c.kv_heads,
                                                   .head_dim = c.head_dim,
                                                   .preset = *preset,
                                                   .pages = 4096},
                                                  *backend_);
    ASSERT_TRUE(cache_or.ok()) << cache_or.status();
    kvstore::PagedKvCache& cache = **cache_or;
    const std::vector<int32_t> greedy_want = g["greedy_tokens"];
    ASSERT_TRUE(cache.AddSequence(0, want_ids.size() + greedy_want.size() + 1).ok());
    std::vector<float> logits(c.vocab);
    ASSERT_TRUE(model_->Forward({{0, want_ids}}, cache, logits.data()).ok());
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < c.vocab; ++i) {
      max_err = std::max(max_err, std::fabs(double(logits[i]) - want[i]));
      max_ref = std::max(max_ref, std::fabs(double(want[i])));
    }
    const double rel = max_err / max_ref;
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-3) << "max |logit - HF| = " << max_err << " of max |HF| = " << max_ref;
    RecordProperty(name + "_max_rel_error", absl::StrFormat("%.3g", rel));

    std::vector<int32_t> greedy;
    for (size_t step = 0; step < greedy_want.size(); ++step) {
      const int32_t next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      greedy.push_back(next);
      if (step + 1 == greedy_want.size()) break;
      const int32_t one[1] = {next};
      ASSERT_TRUE(model_->Forward({{0, one}}, cache, logits.data()).ok());
    }
    EXPECT_EQ(greedy, greedy_want)
        << "greedy continuation differs; ours: \"" << tokenizer_->Decode(greedy) << "\"";
  }
  std::printf("worst max relative logit error vs HF transformers: %.3g\n", worst);
  RecordProperty("worst_max_rel_error", absl::StrFormat("%.3g", worst));
}

}  // namespace
}  // namespace sluice::model
