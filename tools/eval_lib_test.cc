// sluice eval on the real model: fp16 against itself is exact, a compressed preset diverges a
// little and holds less, and bad options are named.
#include "tools/eval_lib.h"

#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/tokenizer.h"

namespace sluice::tools {
namespace {

TEST(Eval, Fp16MatchesItselfAndCompressedPresetsDivergeALittle) {
  auto gguf = model::GgufFile::Open(model::DefaultModelPath());
  if (gguf.status().code() == absl::StatusCode::kNotFound) {
    GTEST_SKIP() << "model not fetched (./sluice fetch-model): " << gguf.status();
  }
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto vocab = model::VocabFromGguf(**gguf);
  ASSERT_TRUE(vocab.ok());
  auto tokenizer = model::Tokenizer::Create(std::move(*vocab));
  ASSERT_TRUE(tokenizer.ok());
  auto cpu = kernels::CpuBackend::Create();
  ASSERT_TRUE(cpu.ok());
  auto llama = model::LlamaModel::Load(**gguf, **cpu);
  ASSERT_TRUE(llama.ok()) << llama.status();
  std::ifstream in("/usr/share/common-licenses/GPL-3");  // Debian's base-files ships it
  std::stringstream text;
  text << in.rdbuf();
  auto tokens = (*tokenizer)->Encode(text.str(), false);
  ASSERT_TRUE(tokens.ok());

  EvalOptions o{.presets = {"fp16", "kivi2", "kvcomp"},
                .context = 128,
                .max_windows = 2,
                .batch = 2,
                .residual = 16};
  auto results = RunEval(o, **llama, **cpu, *tokens);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  const EvalResult& fp16 = (*results)[0];
  EXPECT_EQ(fp16.preset, "fp16");
  EXPECT_EQ(fp16.windows, 2);
  EXPECT_EQ(fp16.tokens, 2 * 64);
  EXPECT_EQ(fp16.kl, 0.0);
  EXPECT_EQ(fp16.top1, 1.0);
  EXPECT_EQ(fp16.ppl, fp16.ppl_fp16);
  EXPECT_GT(fp16.ppl_fp16, 1.5);  // English legal text, a 135M model
  EXPECT_LT(fp16.ppl_fp16, 60.0);
  // fp16 pages and an fp32 residual window; at 127 tokens the 16 KiB pages are mostly slack.
  EXPECT_GT(fp16.ratio, 0.5);
  for (size_t i = 1; i < results->size(); ++i) {
    const EvalResult& r = (*results)[i];
    SCOPED_TRACE(r.preset);
    EXPECT_EQ(r.ppl_fp16, fp16.ppl_fp16);
    EXPECT_GT(r.kl, 0.0);
    EXPECT_LT(r.kl, 1.0);
    EXPECT_GT(r.top1, 0.5);
    EXPECT_LT(std::abs(r.ppl / r.ppl_fp16 - 1), 1.0);  // 2-bit keys with a 16-token window
    EXPECT_GT(r.ratio, fp16.ratio);
    EXPECT_GT(r.pages, 0);
  }

  o.context = 1 << 20;
  EXPECT_THAT(RunEval(o, **llama, **cpu, *tokens).status().message(),
              ::testing::HasSubstr("--context"));
  o.context = 128;
  EXPECT_THAT(RunEval(o, **llama, **cpu, std::vector<int32_t>(100, 1)).status().message(),
              ::testing::HasSubstr("fewer than one window"));
  o.budget = 1.5f;
  EXPECT_THAT(RunEval(o, **llama, **cpu, *tokens).status().message(),
              ::testing::HasSubstr("--budget"));
  o.budget = -1.f;
  o.presets = {"nope"};
  EXPECT_THAT(RunEval(o, **llama, **cpu, *tokens).status().message(),
              ::testing::HasSubstr("unknown KV preset"));
}

TEST(EvalLib, CalibrationPicksTheSmallestKvWithinTheBar) {
  auto result = [](double dppl, double top1, double kl, double ratio) {
    return EvalResult{
        .ppl = 10 * (1 + dppl / 100), .ppl_fp16 = 10, .kl = kl, .top1 = top1, .ratio = ratio};
  };
  // Within the bar (+1%, 97%): the first and third; the third holds less.
  std::vector<EvalResult> rs = {result(0.2, 0.99, 0.01, 2.0), result(3.0, 0.99, 0.05, 6.0),
                                result(0.9, 0.975, 0.02, 3.0), result(0.1, 0.95, 0.03, 9.0)};
  EXPECT_EQ(PickCalibrated(rs, 1.0, 0.97), 2);
  // None within the bar: the smallest KL.
  EXPECT_EQ(PickCalibrated(rs, 0.05, 0.97), 0);
  EXPECT_EQ(PickCalibrated({}, 1.0, 0.97), -1);
}

}  // namespace
}  // namespace sluice::tools
