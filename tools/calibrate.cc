// ./sluice calibrate: fits the transform-coded wire's bases (and cross-layer predictors) for a
// model on a calibration text and writes them beside the model, where the workers and
// `./sluice up` find them (model::KvCalibrationPath).
//
//   ./sluice calibrate [--text /usr/share/common-licenses/GPL-3] [--tokens 4096] [--out FILE]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/registry.h"
#include "kvstore/wire/kv_transform.h"
#include "kvstore/wire/kv_transform_calibration.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/model_path.h"
#include "model/tokenizer.h"

ABSL_FLAG(std::string, model, "", "GGUF model path (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(std::string, text, "/usr/share/common-licenses/GPL-3",
          "Calibration text (Debian ships the GPL-3 on every machine).");
ABSL_FLAG(int64_t, tokens, 4096, "Tokens of --text to fit on (one forward pass).");
ABSL_FLAG(bool, cross_layer, true,
          "Also fit each layer's predictor from the layer before (the wire codes what it misses).");
ABSL_FLAG(std::string, out, "", "Where to write it (default: beside the model, .kvtc).");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = one per core.");

namespace sluice {
namespace {

absl::Status Run() {
  const std::string model_path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out).empty() ? model::KvCalibrationPath(model_path)
                                                           : absl::GetFlag(FLAGS_out);
  SLUICE_ASSIGN_OR_RETURN(auto gguf, model::GgufFile::Open(model_path));
  SLUICE_ASSIGN_OR_RETURN(model::VocabSpec vocab, model::VocabFromGguf(*gguf));
  SLUICE_ASSIGN_OR_RETURN(auto tokenizer, model::Tokenizer::Create(std::move(vocab)));
  // Calibration records the KV on the host.
  SLUICE_ASSIGN_OR_RETURN(auto backend,
                          kernels::CreateNamedBackend("cpu", absl::GetFlag(FLAGS_threads)));
  SLUICE_ASSIGN_OR_RETURN(auto llama, model::LlamaModel::Load(*gguf, *backend));
  const std::string text_path = absl::GetFlag(FLAGS_text);
  std::ifstream in(text_path);
  if (!in) return absl::NotFoundError("cannot read --text " + text_path);
  std::stringstream text;
  text << in.rdbuf();
  SLUICE_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, tokenizer->Encode(text.str(), false));
  const int64_t want = absl::GetFlag(FLAGS_tokens);
  if (want < 2 || want > llama->config().context_length ||
      static_cast<int64_t>(tokens.size()) < want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--text %s has %d tokens; --tokens %d must be at least 2 and within both it and the "
        "model's context of %d",
        text_path, tokens.size(), want, llama->config().context_length));
  }
  tokens.resize(want);
  const absl::Time start = absl::Now();
  SLUICE_ASSIGN_OR_RETURN(kvstore::KvTransformCalibration calibration,
                          kvstore::CalibrateKvTransform(*llama, *backend, *gguf, tokens,
                                                        absl::GetFlag(FLAGS_cross_layer)));
  // Written whole, then renamed: a reader never sees half a file.
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << kvstore::SerializeKvTransformCalibration(calibration);
    if (!f) return absl::InternalError("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  if (ec)
    return absl::InternalError(
        absl::StrFormat("cannot rename %s to %s: %s", tmp, out, ec.message()));
  std::printf("%s: %zu layers fitted on %lld tokens of %s%s in %.1f s; calibration %08x\n",
              out.c_str(), calibration.k.size(), static_cast<long long>(want), text_path.c_str(),
              absl::GetFlag(FLAGS_cross_layer) ? " with cross-layer predictors" : "",
              absl::ToDoubleSeconds(absl::Now() - start),
              kvstore::KvTransformCalibrationChecksum(calibration));
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = sluice::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "sluice calibrate: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
