// sluice eval: how much a KV compression preset changes the model's next-token predictions.
//
// Teacher-forced over windows of `context` tokens of a text. In each window the first half goes
// in as one prompt (the prefill, where prompt-phase policies act) and the second half token by
// token (decode, where generation-phase policies act); every prediction of the second half is
// compared with the same prediction under fp16 KV, run in lockstep on the same windows.
#ifndef SLUICE_TOOLS_EVAL_LIB_H_
#define SLUICE_TOOLS_EVAL_LIB_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kvstore/wire/kv_transform.h"
#include "model/llama.h"
#include "tools/trial_kv_cache.h"

namespace sluice::tools {

struct EvalOptions {
  std::vector<std::string> presets;  // compared with fp16 (fp16 itself may be listed)
  int64_t context = 1024;            // tokens per window, >= 4
  int64_t stride = 0;                // window starts; 0 = context (disjoint windows)
  int64_t max_windows = 0;           // 0 = every window that fits the text
  int64_t batch = 4;                 // windows decoded together
  int32_t residual = -1;             // full-precision window of every preset; -1 = its own
  float budget = -1.f;               // fraction kept by evicting presets; -1 = their own
  // The transform-coded wire (kvstore/wire/wire_encoding_kv_cache.h): every preset again with
  // its prompts' KV through the codec at each of these budgets (entropy-coded bits per key value
  // and per value value), named "PRESET+kvtcK/V" ("PRESET+kvtcxK/V" when the calibration predicts
  // across layers). Needs `calibration` and a host-memory backend.
  struct WireBudget {
    double k = 0, v = 0;
  };
  std::vector<WireBudget> wire_bits;
  const kvstore::KvTransformCalibration* calibration = nullptr;
  int64_t wire_sinks = 4;  // first tokens of each prompt that cross exact
  // Emulated resident formats (trial_kv_cache.h), named "trial:SPEC"; tc formats need
  // `trial_bases`. `residual` and `budget` leave them alone.
  std::vector<std::string> trials;
  const TrialBases* trial_bases = nullptr;
  // Called after each decode step with (predictions done, predictions in all).
  std::function<void(int64_t, int64_t)> progress;
};

struct EvalResult {
  std::string preset;
  int64_t tokens = 0;  // predictions scored (the second halves of the windows)
  int64_t windows = 0;
  double ppl = 0, ppl_fp16 = 0;
  double kl = 0;    // mean KL(fp16 || preset) of next-token distributions, nats
  double top1 = 0;  // fraction of predictions whose top token matches fp16's
  // fp16 bytes of the KV against what the preset holds for it at the end of each window:
  // pages (whole, slack included), full-precision residual windows, codebooks.
  double ratio = 0;
  // fp16 bytes of the prompts' KV against the bytes that cross from prefill to decode: the
  // transform codec's blocks and exact rows for "+kvtc" arms; for the others, what the preset
  // holds right after the prefill (pages and window), which its export carries.
  double wire_ratio = 0;
  double pages = 0;  // pages per window at its end (all layers and kv-heads)
};

// `tokens`: the whole text. InvalidArgument for bad options or a text shorter than one window.
absl::StatusOr<std::vector<EvalResult>> RunEval(const EvalOptions& options,
                                                model::LlamaModel& llama, kernels::Backend& backend,
                                                const std::vector<int32_t>& tokens);

// `sluice eval calibrate`'s choice among settings: the index of the result with the largest
// ratio among those at most `max_dppl` percent above fp16's perplexity and at least `min_top1`
// in top-1 agreement; if none is, the one with the smallest KL; -1 for no results.
int PickCalibrated(const std::vector<EvalResult>& results, double max_dppl, double min_top1);

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_EVAL_LIB_H_
