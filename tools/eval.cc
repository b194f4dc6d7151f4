// sluice eval: perplexity, KL divergence and top-1 agreement against fp16 KV, and the KV size
// against fp16, of compression presets on a text file (tools/eval_lib.h says how).
//
//   ./sluice eval --text /usr/share/common-licenses/GPL-3 --preset kivi2,kvcomp --context 1024
//   ./sluice eval --text FILE --preset kivi4 --json
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/eval_lib.h"

ABSL_FLAG(std::string, text, "", "UTF-8 text file to evaluate on (required).");
ABSL_FLAG(std::string, preset, "int8,kivi4,kivi2,kvcomp,sinks,snapkv,pyramid,h2o",
          "Presets to compare with fp16, comma-separated.");
ABSL_FLAG(int64_t, context, 1024, "Tokens per window: the first half is the prompt.");
ABSL_FLAG(int64_t, stride, 0, "Tokens from one window's start to the next; 0 = --context.");
ABSL_FLAG(int64_t, max_windows, 0, "Most windows to evaluate; 0 = all that fit the text.");
ABSL_FLAG(int64_t, batch, 4, "Windows decoded together.");
ABSL_FLAG(double, budget, -1,
          "Fraction of the tokens evicting presets (sinks, snapkv) keep; -1 = each preset's own.");
ABSL_FLAG(int32_t, residual, -1,
          "Full-precision recent window of every preset, in tokens; -1 = each preset's own.");
ABSL_FLAG(bool, json, false, "One JSON line per preset on stdout instead of a table.");
ABSL_FLAG(std::string, model, "", "GGUF model path (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = one per core.");

namespace sluice {
namespace {

absl::Status Run() {
  const std::string text_path = absl::GetFlag(FLAGS_text);
  if (text_path.empty()) return absl::InvalidArgumentError("--text FILE is required");
  std::ifstream in(text_path);
  if (!in) return absl::NotFoundError("cannot read --text " + text_path);
  std::stringstream text;
  text << in.rdbuf();

  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  SLUICE_ASSIGN_OR_RETURN(auto gguf, model::GgufFile::Open(path));
  SLUICE_ASSIGN_OR_RETURN(model::VocabSpec vocab, model::VocabFromGguf(*gguf));
  SLUICE_ASSIGN_OR_RETURN(auto tokenizer, model::Tokenizer::Create(std::move(vocab)));
  SLUICE_ASSIGN_OR_RETURN(auto backend,
                          kernels::CpuBackend::Create({.threads = absl::GetFlag(FLAGS_threads)}));
  SLUICE_ASSIGN_OR_RETURN(auto llama, model::LlamaModel::Load(*gguf, *backend));
  SLUICE_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, tokenizer->Encode(text.str(), false));

  tools::EvalOptions o;
  o.presets = absl::StrSplit(absl::GetFlag(FLAGS_preset), ',', absl::SkipEmpty());
  o.context = absl::GetFlag(FLAGS_context);
  o.stride = absl::GetFlag(FLAGS_stride);
  o.max_windows = absl::GetFlag(FLAGS_max_windows);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.residual = absl::GetFlag(FLAGS_residual);
  o.budget = static_cast<float>(absl::GetFlag(FLAGS_budget));
  int64_t shown = -1;  // the percentage on screen
  o.progress = [&shown](int64_t done, int64_t total) {
    const int64_t percent = 100 * done / total;
    if (percent == shown) return;
    shown = percent;
    constexpr int kWidth = 40;
    const int filled = static_cast<int>(kWidth * done / total);
    std::fprintf(stderr, "\r[%s%s] %lld/%lld predictions", std::string(filled, '=').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total));
    if (done == total) std::fputc('\n', stderr);
  };
  SLUICE_ASSIGN_OR_RETURN(std::vector<tools::EvalResult> results,
                          tools::RunEval(o, *llama, *backend, tokens));
  if (absl::GetFlag(FLAGS_json)) {
    for (const tools::EvalResult& r : results) {
      const nlohmann::json line = {
          {"preset", r.preset},     {"tokens", r.tokens}, {"ppl", r.ppl},
          {"ppl_fp16", r.ppl_fp16}, {"kl", r.kl},         {"top1", r.top1},
          {"ratio", r.ratio},       {"pages", r.pages},   {"context", o.context},
          {"windows", r.windows},   {"text", text_path}};
      std::cout << line.dump() << "\n";
    }
    return absl::OkStatus();
  }
  std::printf("%s: %lld tokens, %lld windows of %lld (second halves scored)\n", text_path.c_str(),
              static_cast<long long>(tokens.size()),
              static_cast<long long>(results.front().windows), static_cast<long long>(o.context));
  std::printf("%-8s %9s %9s %8s %10s %7s %8s %9s\n", "preset", "ppl", "ppl fp16", "dppl %",
              "KL nats", "top-1", "ratio", "pages");
  for (const tools::EvalResult& r : results) {
    std::printf("%-8s %9.3f %9.3f %+8.2f %10.5f %6.2f%% %7.2fx %9.1f\n", r.preset.c_str(), r.ppl,
                r.ppl_fp16, 100.0 * (r.ppl / r.ppl_fp16 - 1), r.kl, 100.0 * r.top1, r.ratio,
                r.pages);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sluice eval --text FILE [--preset P,...] [--context N] [--stride S] [--json]");
  absl::ParseCommandLine(argc, argv);
  if (absl::Status st = sluice::Run(); !st.ok()) {
    std::fprintf(stderr, "sluice eval: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
