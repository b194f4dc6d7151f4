// sluice eval on the real model: fp16 against itself is exact, a compressed preset diverges a
// little and holds less, and bad options are named.
#include "tools/eval_lib.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kvstore/wire/kv_transform_calibration.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/tokenizer.h"

namespace sluice::tools {
namespace {

// The real model on the CPU and the GPL-3's tokens (Debian's base-files ships it); skips the
// test when the model is not fetched.
class Eval : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = model::GgufFile::Open(model::DefaultModelPath());
    if (g.status().code() == absl::StatusCode::kNotFound) {
      GTEST_SKIP() << "model not fetched (./sluice fetch-model): " << g.status();
    }
    ASSERT_TRUE(g.ok()) << g.status();
    gguf_ = *std::move(g);
    auto vocab = model::VocabFromGguf(*gguf_);
    ASSERT_TRUE(vocab.ok());
    auto tokenizer = model::Tokenizer::Create(std::move(*vocab));
    ASSERT_TRUE(tokenizer.ok());
    auto cpu = kernels::CpuBackend::Create();
    ASSERT_TRUE(cpu.ok());
    cpu_ = *std::move(cpu);
    auto llama = model::LlamaModel::Load(*gguf_, *cpu_);
    ASSERT_TRUE(llama.ok()) << llama.status();
    llama_ = *std::move(llama);
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    std::stringstream text;
    text << in.rdbuf();
    auto tokens = (*tokenizer)->Encode(text.str(), false);
    ASSERT_TRUE(tokens.ok());
    tokens_ = *std::move(tokens);
  }

  std::unique_ptr<model::GgufFile> gguf_;
  std::unique_ptr<kernels::CpuBackend> cpu_;
  std::unique_ptr<model::LlamaModel> llama_;
  std::vector<int32_t> tokens_;
};

TEST_F(Eval, Fp16MatchesItselfAndCompressedPresetsDivergeALittle) {
  auto& cpu = cpu_;
  auto& llama = llama_;
  const std::vector<int32_t>* tokens = &tokens_;

  EvalOptions o{.presets = {"fp16", "kivi2", "kvcomp"},
                .context = 128,
                .max_windows = 2,
                .batch = 2,
                .residual = 16};
  auto results = RunEval(o, *llama, *cpu, *tokens);
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
  EXPECT_THAT(RunEval(o, *llama, *cpu, *tokens).status().message(),
              ::testing::HasSubstr("--context"));
  o.context = 128;
  EXPECT_THAT(RunEval(o, *llama, *cpu, std::vector<int32_t>(100, 1)).status().message(),
              ::testing::HasSubstr("fewer than one window"));
  o.budget = 1.5f;
  EXPECT_THAT(RunEval(o, *llama, *cpu, *tokens).status().message(),
              ::testing::HasSubstr("--budget"));
  o.budget = -1.f;
  o.presets = {"nope"};
  EXPECT_THAT(RunEval(o, *llama, *cpu, *tokens).status().message(),
              ::testing::HasSubstr("unknown KV preset"));
}

// The transform-coded wire: bases fitted on the GPL-3's first 512 tokens, windows taken from
// later in the text. At 8 bits per value the prompts cross nearly exact; at 2/4 in fewer bytes
// and less exactly; bad budgets and calibrations are named.
TEST_F(Eval, TheTransformCodedWireCrossesFewerBytesAtAKnownCost) {
  auto& cpu = cpu_;
  auto& llama = llama_;
  auto& gguf = gguf_;
  const std::vector<int32_t>* tokens = &tokens_;
  ASSERT_GT(tokens->size(), 3000u);
  auto calibration = kvstore::CalibrateKvTransform(
      *llama, *cpu, *gguf, std::vector<int32_t>(tokens->begin(), tokens->begin() + 512));
  ASSERT_TRUE(calibration.ok()) << calibration.status();
  const std::vector<int32_t> later(tokens->begin() + 2000, tokens->end());

  EvalOptions o{.presets = {"fp16"},
                .context = 256,
                .max_windows = 2,
                .batch = 2,
                .residual = 16,
                .wire_bits = {{8, 8}, {2, 4}},
                .calibration = &*calibration};
  auto results = RunEval(o, *llama, *cpu, later);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  const EvalResult &plain = (*results)[0], &fine = (*results)[1], &coarse = (*results)[2];
  EXPECT_EQ(fine.preset, "fp16+kvtc8/8");
  EXPECT_EQ(coarse.preset, "fp16+kvtc2/4");
  for (const EvalResult& r : *results) {
    SCOPED_TRACE(r.preset);
    EXPECT_GT(r.wire_ratio, 0.0);
    EXPECT_EQ(r.ratio, plain.ratio);  // the same resident preset
  }
  // 8 bits: within a few thousandths of a nat (keys lose RoPE and get it back: a wrong position
  // would cost far more).
  EXPECT_LT(fine.kl, 0.01);
  EXPECT_GT(fine.top1, 0.95);
  EXPECT_GT(fine.wire_ratio, 1.3);
  EXPECT_GT(coarse.kl, fine.kl);
  EXPECT_LT(coarse.kl, 0.2);
  EXPECT_GT(coarse.wire_ratio, 2.5);
  EXPECT_GT(coarse.wire_ratio, fine.wire_ratio);

  // Cross-layer prediction: layers after the first get predictors, and what they leave of
  // the values varies less than the values themselves in most layers.
  auto cross = kvstore::CalibrateKvTransform(
      *llama, *cpu, *gguf, std::vector<int32_t>(tokens->begin(), tokens->begin() + 512),
      /*cross_layer=*/true);
  ASSERT_TRUE(cross.ok()) << cross.status();
  int less = 0;
  const int layers = static_cast<int>(cross->v.size());
  EXPECT_TRUE(cross->k_predict[0].empty());
  for (int l = 1; l < layers; ++l) {
    ASSERT_FALSE(cross->v_predict[l].empty()) << l;
    double residual = 0, plain_var = 0;
    for (float x : cross->v[l].variance) residual += x;
    for (float x : calibration->v[l].variance) plain_var += x;
    less += residual < plain_var;
  }
  EXPECT_GE(less, (layers - 1) * 8 / 10);
  o.calibration = &*cross;
  o.wire_bits = {{8, 8}};
  auto crossed = RunEval(o, *llama, *cpu, later);
  ASSERT_TRUE(crossed.ok()) << crossed.status();
  EXPECT_EQ((*crossed)[1].preset, "fp16+kvtcx8/8");
  EXPECT_LT((*crossed)[1].kl, 0.01);  // predictions are added back exactly as subtracted
  o.calibration = &*calibration;

  o.wire_bits = {{2, 9}};
  EXPECT_THAT(RunEval(o, *llama, *cpu, later).status().message(),
              ::testing::HasSubstr("wire bits per value 9"));
  o.wire_bits = {{2, 4}};
  o.calibration = nullptr;
  EXPECT_THAT(RunEval(o, *llama, *cpu, later).status().message(),
              ::testing::HasSubstr("needs a calibration"));
  kvstore::KvTransformCalibration short_one = *calibration;
  short_one.k.pop_back();
  short_one.v.pop_back();
  o.calibration = &short_one;
  EXPECT_THAT(RunEval(o, *llama, *cpu, later).status().message(),
              ::testing::HasSubstr("the calibration has"));
  EXPECT_FALSE(kvstore::CalibrateKvTransform(*llama, *cpu, *gguf, {1}).ok());
}

// Trial formats run beside the presets: the kivi trial of `sluice` with its fp32 window counts
// the preset's bytes exactly and diverges as much; tc at 8 bits is near exact.
TEST_F(Eval, TrialFormatsRunBesideThePresetTheyEmulate) {
  ASSERT_GT(tokens_.size(), 3000u);
  auto bases = FitTrialBases(*llama_, *cpu_, *gguf_,
                             std::vector<int32_t>(tokens_.begin(), tokens_.begin() + 512));
  ASSERT_TRUE(bases.ok()) << bases.status();
  ASSERT_EQ(bases->k_pre.size(), static_cast<size_t>(llama_->config().layers));
  const std::vector<int32_t> later(tokens_.begin() + 2000, tokens_.end());
  EvalOptions o{.presets = {"sluice"},
                .context = 256,
                .max_windows = 1,
                .batch = 1,
                .trials = {"kivi:exact=fp32", "tc:kb=8:vb=8:sinks=4:steps=minmax:rope=pre"},
                .trial_bases = &*bases};
  auto results = RunEval(o, *llama_, *cpu_, later);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  const EvalResult &preset = (*results)[0], &kivi = (*results)[1], &tc = (*results)[2];
  EXPECT_EQ(kivi.preset, "trial:kivi:exact=fp32");
  EXPECT_EQ(kivi.ratio, preset.ratio);
  EXPECT_EQ(kivi.wire_ratio, preset.wire_ratio);
  EXPECT_NEAR(kivi.kl, preset.kl, 0.25 * preset.kl);
  EXPECT_GT(kivi.kl, 0.0);
  EXPECT_LT(tc.kl, preset.kl);
  EXPECT_GT(tc.top1, 0.97);
  EXPECT_GT(tc.ratio, 1.0);

  o.trial_bases = nullptr;
  EXPECT_THAT(RunEval(o, *llama_, *cpu_, later).status().message(),
              ::testing::HasSubstr("needs bases"));
  o.trials = {"kivi:kb=5"};
  EXPECT_THAT(RunEval(o, *llama_, *cpu_, later).status().message(), ::testing::HasSubstr("kb=5"));
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
