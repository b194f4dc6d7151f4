// sluice eval: perplexity, KL divergence and top-1 agreement against fp16 KV, and the KV size
// against fp16, of compression presets on a text file (tools/eval_lib.h says how).
//
//   ./sluice eval --text /usr/share/common-licenses/GPL-3 --preset kivi2,kvcomp --context 1024
//   ./sluice eval --text FILE --preset kivi4 --json
//   ./sluice eval calibrate --text FILE --preset leankv-k8v4   (picks alpha_high, alpha_low)
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "kernels/registry.h"
#include "kvstore/kv_preset.h"
#include "kvstore/wire/kv_transform.h"
#include "kvstore/wire/kv_transform_calibration.h"
#include "kvstore/wire/kv_wire_codec.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/eval_lib.h"

ABSL_FLAG(std::string, text, "", "UTF-8 text file to evaluate on (required).");
ABSL_FLAG(std::string, preset, "",
          "Presets to compare with fp16, comma-separated, each a name with optional "
          "\":key=value\" settings (kvstore/kv_preset.h); default: every compressed preset. "
          "calibrate: the leankv preset whose thresholds to pick (default: leankv-k8v4).");
ABSL_FLAG(double, max_dppl, 1.0,
          "calibrate: largest perplexity increase over fp16 allowed, percent.");
ABSL_FLAG(double, min_top1, 0.97, "calibrate: smallest top-1 agreement with fp16 allowed.");
ABSL_FLAG(double, alpha_high, -1,
          "calibrate: take this alpha_high and pick alpha_low only; -1 = pick both.");
ABSL_FLAG(int64_t, context, 1024, "Tokens per window: the first half is the prompt.");
ABSL_FLAG(int64_t, stride, 0, "Tokens from one window's start to the next; 0 = --context.");
ABSL_FLAG(int64_t, max_windows, 0, "Most windows to evaluate; 0 = all that fit the text.");
ABSL_FLAG(int64_t, batch, 4, "Windows decoded together.");
ABSL_FLAG(double, budget, -1,
          "Fraction of the tokens evicting presets (sinks, snapkv) keep; -1 = each preset's own.");
ABSL_FLAG(int32_t, residual, -1,
          "Full-precision recent window of every preset, in tokens; -1 = each preset's own.");
ABSL_FLAG(std::string, wire_bits, "",
          "Transform-coded wire: evaluate every preset again with its prompts' KV through the "
          "codec at each of these budgets, comma-separated, each entropy-coded bits per value "
          "for keys and values (3) or for keys/values (1.5/3); empty: none.");
ABSL_FLAG(std::string, kv_calibration, "",
          "--wire_bits: a calibration file (./sluice calibrate) instead of fitting one here.");
ABSL_FLAG(std::string, calibration_text, "/usr/share/common-licenses/GPL-3",
          "Text the wire codec's bases are fitted on (Debian's base-files ships the GPL-3).");
ABSL_FLAG(int64_t, calibration_tokens, 4096, "Tokens of --calibration_text to fit on.");
ABSL_FLAG(bool, wire_cross_layer, false,
          "Wire codec: predict each layer's keys and values from the layer before's and code "
          "what the prediction misses.");
ABSL_FLAG(std::string, trial, "",
          "Emulated resident formats to compare too, comma-separated (tools/trial_kv_cache.h): "
          "kivi or tc with \":key=value\" settings, e.g. tc:kb=2:vb=4:steps=group; tc fits its "
          "bases on --calibration_text.");
ABSL_FLAG(bool, json, false, "One JSON line per preset on stdout instead of a table.");
ABSL_FLAG(std::string, model, "", "GGUF model path (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = one per core.");
ABSL_FLAG(std::string, backend, "auto",
          "auto (CUDA where a GPU is usable, else CPU), cpu, cuda or ref.");

namespace sluice {
namespace {

struct Loaded {
  std::string text_path;
  std::unique_ptr<model::GgufFile> gguf;
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::LlamaModel> llama;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::vector<int32_t> tokens;

  // The tokens of a text file; `flag` names it in errors.
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& file,
                                                const std::string& flag) const {
    std::ifstream in(file);
    if (!in) return absl::NotFoundError(absl::StrFormat("cannot read %s %s", flag, file));
    std::stringstream text;
    text << in.rdbuf();
    return tokenizer->Encode(text.str(), false);
  }
};

absl::StatusOr<Loaded> Load() {
  Loaded l;
  l.text_path = absl::GetFlag(FLAGS_text);
  if (l.text_path.empty()) return absl::InvalidArgumentError("--text FILE is required");
  if (!std::ifstream(l.text_path)) return absl::NotFoundError("cannot read --text " + l.text_path);
  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  SLUICE_ASSIGN_OR_RETURN(l.gguf, model::GgufFile::Open(path));
  SLUICE_ASSIGN_OR_RETURN(model::VocabSpec vocab, model::VocabFromGguf(*l.gguf));
  SLUICE_ASSIGN_OR_RETURN(l.tokenizer, model::Tokenizer::Create(std::move(vocab)));
  SLUICE_ASSIGN_OR_RETURN(l.backend, kernels::CreateNamedBackend(absl::GetFlag(FLAGS_backend),
                                                                 absl::GetFlag(FLAGS_threads)));
  std::fprintf(stderr, "backend: %s\n", l.backend->name().c_str());
  SLUICE_ASSIGN_OR_RETURN(l.llama, model::LlamaModel::Load(*l.gguf, *l.backend));
  SLUICE_ASSIGN_OR_RETURN(l.tokens, l.Tokenize(l.text_path, "--text"));
  return l;
}

tools::EvalOptions OptionsFromFlags() {
  tools::EvalOptions o;
  o.context = absl::GetFlag(FLAGS_context);
  o.stride = absl::GetFlag(FLAGS_stride);
  o.max_windows = absl::GetFlag(FLAGS_max_windows);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.residual = absl::GetFlag(FLAGS_residual);
  o.budget = static_cast<float>(absl::GetFlag(FLAGS_budget));
  auto shown = std::make_shared<int64_t>(-1);  // the percentage on screen
  o.progress = [shown](int64_t done, int64_t total) {
    const int64_t percent = 100 * done / total;
    if (percent == *shown) return;
    *shown = percent;
    constexpr int kWidth = 40;
    const int filled = static_cast<int>(kWidth * done / total);
    std::fprintf(stderr, "\r[%s%s] %lld/%lld predictions", std::string(filled, '=').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total));
    if (done == total) {
      std::fputc('\n', stderr);
      *shown = -1;
    }
  };
  return o;
}

nlohmann::json ResultJson(const tools::EvalResult& r, const tools::EvalOptions& o,
                          const std::string& text_path) {
  return {{"preset", r.preset},   {"tokens", r.tokens},
          {"ppl", r.ppl},         {"ppl_fp16", r.ppl_fp16},
          {"kl", r.kl},           {"top1", r.top1},
          {"ratio", r.ratio},     {"wire_ratio", r.wire_ratio},
          {"pages", r.pages},     {"context", o.context},
          {"windows", r.windows}, {"text", text_path}};
}

void PrintTable(const std::vector<tools::EvalResult>& results) {
  int width = 6;
  for (const tools::EvalResult& r : results) width = std::max<int>(width, r.preset.size());
  std::printf("%-*s %9s %9s %8s %10s %7s %8s %8s %9s\n", width, "preset", "ppl", "ppl fp16",
              "dppl %", "KL nats", "top-1", "ratio", "wire", "pages");
  for (const tools::EvalResult& r : results) {
    std::printf("%-*s %9.3f %9.3f %+8.2f %10.5f %6.2f%% %7.2fx %7.2fx %9.1f\n", width,
                r.preset.c_str(), r.ppl, r.ppl_fp16, 100.0 * (r.ppl / r.ppl_fp16 - 1), r.kl,
                100.0 * r.top1, r.ratio, r.wire_ratio, r.pages);
  }
}

// The first --calibration_tokens tokens of --calibration_text.
absl::StatusOr<std::vector<int32_t>> CalibrationTokens(Loaded& l) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                          l.Tokenize(absl::GetFlag(FLAGS_calibration_text), "--calibration_text"));
  const int64_t want = absl::GetFlag(FLAGS_calibration_tokens);
  if (want < 2 || static_cast<int64_t>(tokens.size()) < want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--calibration_text %s has %d tokens; --calibration_tokens asks for %d (at least 2)",
        absl::GetFlag(FLAGS_calibration_text), tokens.size(), want));
  }
  tokens.resize(want);
  return tokens;
}

absl::Status Run() {
  SLUICE_ASSIGN_OR_RETURN(Loaded l, Load());
  tools::EvalOptions o = OptionsFromFlags();
  o.presets = absl::StrSplit(absl::GetFlag(FLAGS_preset), ',', absl::SkipEmpty());
  o.trials = absl::StrSplit(absl::GetFlag(FLAGS_trial), ',', absl::SkipEmpty());
  if (o.presets.empty() && o.trials.empty()) {
    for (const std::string& name : kvstore::KvPresetNames()) {
      if (name != "fp16") o.presets.push_back(name);
    }
  }
  kvstore::KvTransformCalibration calibration;
  for (absl::string_view spec :
       absl::StrSplit(absl::GetFlag(FLAGS_wire_bits), ',', absl::SkipEmpty())) {
    SLUICE_ASSIGN_OR_RETURN(const kvstore::KvWireBits bits,
                            kvstore::ParseKvWireBits(std::string(spec)));
    const tools::EvalOptions::WireBudget b{.k = bits.key, .v = bits.value};
    o.wire_bits.push_back(b);
  }
  if (!o.wire_bits.empty() && !absl::GetFlag(FLAGS_kv_calibration).empty()) {
    SLUICE_ASSIGN_OR_RETURN(
        calibration, kvstore::ReadKvTransformCalibration(absl::GetFlag(FLAGS_kv_calibration)));
    o.calibration = &calibration;
  } else if (!o.wire_bits.empty()) {
    SLUICE_ASSIGN_OR_RETURN(const std::vector<int32_t> calib_tokens, CalibrationTokens(l));
    const int64_t want = static_cast<int64_t>(calib_tokens.size());
    const absl::Time start = absl::Now();
    SLUICE_ASSIGN_OR_RETURN(
        calibration, kvstore::CalibrateKvTransform(*l.llama, *l.backend, *l.gguf, calib_tokens,
                                                   absl::GetFlag(FLAGS_wire_cross_layer)));
    std::fprintf(stderr, "wire codec: bases fitted on %lld tokens of %s in %.1f s\n",
                 static_cast<long long>(want), absl::GetFlag(FLAGS_calibration_text).c_str(),
                 absl::ToDoubleSeconds(absl::Now() - start));
    o.calibration = &calibration;
  }
  tools::TrialBases trial_bases;
  if (absl::c_any_of(o.trials, [](const std::string& t) { return absl::StartsWith(t, "tc"); })) {
    SLUICE_ASSIGN_OR_RETURN(const std::vector<int32_t> calib_tokens, CalibrationTokens(l));
    SLUICE_ASSIGN_OR_RETURN(trial_bases,
                            tools::FitTrialBases(*l.llama, *l.backend, *l.gguf, calib_tokens));
    o.trial_bases = &trial_bases;
  }
  for (const std::string& spec : o.trials) {
    SLUICE_ASSIGN_OR_RETURN(const tools::TrialFormat f, tools::ParseTrialFormat(spec));
    SLUICE_ASSIGN_OR_RETURN(const auto cache, tools::TrialKvCache::Create(
                                                  f, l.llama->config(), *l.backend, o.trial_bases));
    std::fprintf(stderr, "trial %s\n", cache->Describe().c_str());
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<tools::EvalResult> results,
                          tools::RunEval(o, *l.llama, *l.backend, l.tokens));
  if (absl::GetFlag(FLAGS_json)) {
    for (const tools::EvalResult& r : results) {
      std::cout << ResultJson(r, o, l.text_path).dump() << "\n";
    }
    return absl::OkStatus();
  }
  std::printf("%s: %lld tokens, %lld windows of %lld (second halves scored)\n", l.text_path.c_str(),
              static_cast<long long>(l.tokens.size()),
              static_cast<long long>(results.front().windows), static_cast<long long>(o.context));
  PrintTable(results);
  return absl::OkStatus();
}

// LeanKV §7.2: alpha_high over 0..5 with alpha_low = 0, then alpha_low over five equally spaced
// values in [0, 0.1] at the chosen alpha_high. At each stage the pick is the setting with the
// largest compression ratio among those within --max_dppl and --min_top1 (LeanKV picks the most
// accurate; here fp16's quality is the bar and memory the aim), or the smallest KL if none is.
absl::Status Calibrate() {
  SLUICE_ASSIGN_OR_RETURN(Loaded l, Load());
  const std::string base =
      absl::GetFlag(FLAGS_preset).empty() ? "leankv-k8v4" : absl::GetFlag(FLAGS_preset);
  SLUICE_ASSIGN_OR_RETURN(kvstore::KvPreset preset, kvstore::FindKvPreset(base, 64));
  if (preset.policy.kind != kvstore::KvPolicyKind::kLeanKv) {
    return absl::InvalidArgumentError(
        absl::StrFormat("calibrate picks leankv thresholds; preset %s has none", base));
  }
  const double max_dppl = absl::GetFlag(FLAGS_max_dppl), min_top1 = absl::GetFlag(FLAGS_min_top1);
  auto spec = [&](double high, double low) {
    return absl::StrFormat("%s:alpha_high=%g:alpha_low=%g", base, high, low);
  };
  auto pick = [&](const std::vector<tools::EvalResult>& results) {
    return tools::PickCalibrated(results, max_dppl, min_top1);
  };
  tools::EvalOptions o = OptionsFromFlags();
  std::vector<double> highs = {0, 1, 2, 3, 4, 5};
  if (absl::GetFlag(FLAGS_alpha_high) >= 0) highs = {absl::GetFlag(FLAGS_alpha_high)};
  for (double h : highs) o.presets.push_back(spec(h, 0));
  std::fprintf(stderr, "stage 1: alpha_high in {%s}, alpha_low = 0\n",
               absl::StrJoin(highs, ", ").c_str());
  SLUICE_ASSIGN_OR_RETURN(std::vector<tools::EvalResult> first,
                          tools::RunEval(o, *l.llama, *l.backend, l.tokens));
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("%s: %lld tokens, %lld windows of %lld; bar: dppl <= %g%%, top-1 >= %g%%\n",
                l.text_path.c_str(), static_cast<long long>(l.tokens.size()),
                static_cast<long long>(first.front().windows), static_cast<long long>(o.context),
                max_dppl, 100 * min_top1);
    PrintTable(first);
    std::fflush(stdout);
  }
  const int h = pick(first);
  const double alpha_high = highs[h];
  std::vector<double> lows = {0.025, 0.05, 0.075, 0.1};
  o.presets.clear();
  for (double low : lows) o.presets.push_back(spec(alpha_high, low));
  std::fprintf(stderr, "stage 2: alpha_high = %g, alpha_low in (0, 0.1]\n", alpha_high);
  SLUICE_ASSIGN_OR_RETURN(std::vector<tools::EvalResult> second,
                          tools::RunEval(o, *l.llama, *l.backend, l.tokens));
  second.insert(second.begin(), first[h]);
  lows.insert(lows.begin(), 0);
  const double alpha_low = lows[pick(second)];
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json out = {{"preset", base},         {"alpha_high", alpha_high},
                          {"alpha_low", alpha_low}, {"max_dppl", max_dppl},
                          {"min_top1", min_top1},   {"text", l.text_path},
                          {"context", o.context}};
    for (const auto* stage : {&first, &second}) {
      nlohmann::json rows = nlohmann::json::array();
      for (const tools::EvalResult& r : *stage) rows.push_back(ResultJson(r, o, l.text_path));
      out[stage == &first ? "stage1" : "stage2"] = rows;
    }
    std::cout << out.dump() << "\n";
    return absl::OkStatus();
  }
  PrintTable(second);
  std::printf("picked: %s\n", spec(alpha_high, alpha_low).c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sluice eval --text FILE [--preset P,...] [--context N] [--stride S] [--json]\n"
      "       sluice eval calibrate --text FILE [--preset LEANKV_PRESET] [--context N]");
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 2 || (args.size() == 2 && std::string(args[1]) != "calibrate")) {
    std::fprintf(stderr, "sluice eval: unknown command \"%s\"; the only one is calibrate\n",
                 args.back());
    return 2;
  }
  const absl::Status st = args.size() == 2 ? sluice::Calibrate() : sluice::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "sluice eval: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
