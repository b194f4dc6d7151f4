#include "tools/eval_lib.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "kvstore/wire/wire_encoding_kv_cache.h"
#include "tools/eval_metrics.h"
#include "tools/trial_kv_cache.h"

namespace sluice::tools {
namespace {

// One preset's cache for a batch of windows, and what it has measured so far.
struct Arm {
  kvstore::KvPreset preset;
  EvalOptions::WireBudget wire;      // k > 0: prompts cross the transform-coded wire
  std::optional<TrialFormat> trial;  // an emulated format instead of the preset
  kvstore::PagedKvCache* cache = nullptr;
  TrialKvCache* trial_cache = nullptr;
  std::unique_ptr<model::KvCache> owner;  // the cache, or the wire decorator holding it
  std::vector<float> logits;              // [batch, vocab]
  EvalTotals totals;
  double held_bytes = 0, fp16_bytes = 0, pages = 0;
  double wire_bytes = 0, wire_fp16_bytes = 0;
};

// What an arm's cache holds now against the same KV as fp16, and its pages (0 for a trial).
struct Held {
  double held = 0, fp16 = 0, pages = 0;
};
Held HeldNow(const Arm& arm) {
  if (arm.trial_cache != nullptr) {
    return {.held = static_cast<double>(arm.trial_cache->held_bytes()),
            .fp16 = static_cast<double>(arm.trial_cache->fp16_bytes())};
  }
  const kvstore::KvCacheStats st = arm.cache->Stats();
  return {.held = static_cast<double>(st.held_bytes()),
          .fp16 = static_cast<double>(st.fp16_bytes()),
          .pages = static_cast<double>(st.pages.pages())};
}

}  // namespace

absl::StatusOr<std::vector<EvalResult>> RunEval(const EvalOptions& o, model::LlamaModel& llama,
                                                kernels::Backend& backend,
                                                const std::vector<int32_t>& tokens) {
  const model::LlamaConfig& c = llama.config();
  if (o.context < 4 || o.context > c.context_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--context %d outside [4, %d] (the model's context)", o.context, c.context_length));
  }
  const int64_t stride = o.stride == 0 ? o.context : o.stride;
  if (stride < 1 || o.batch < 1 || o.max_windows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--stride %d, batch %d and --max_windows %d must be positive (0 = default)",
                        o.stride, o.batch, o.max_windows));
  }
  if (o.presets.empty() && o.trials.empty()) {
    return absl::InvalidArgumentError("no preset to evaluate");
  }
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + o.context <= static_cast<int64_t>(tokens.size()); s += stride) {
    if (o.max_windows > 0 && static_cast<int64_t>(starts.size()) == o.max_windows) break;
    starts.push_back(s);
  }
  if (starts.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the text has %d tokens, fewer than one window of --context %d", tokens.size(), o.context));
  }
  const int32_t head_dim = static_cast<int32_t>(c.head_dim);
  if (!o.wire_bits.empty()) {
    if (o.calibration == nullptr) {
      return absl::InvalidArgumentError("a transform-coded wire needs a calibration");
    }
    if (backend.memory_space() != kernels::MemorySpace::kHost) {
      return absl::UnimplementedError(
          "the transform-coded wire is evaluated on host-memory backends only (--backend cpu)");
    }
    if (static_cast<int64_t>(o.calibration->k.size()) != c.layers ||
        o.calibration->k[0].dim != c.kv_heads * c.head_dim) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the calibration has %d layers of dim %d; the model %d of %d", o.calibration->k.size(),
          o.calibration->k.empty() ? 0 : o.calibration->k[0].dim, c.layers,
          c.kv_heads * c.head_dim));
    }
    for (const EvalOptions::WireBudget& b : o.wire_bits) {
      for (double x : {b.k, b.v}) {
        if (!(x > 0 && x <= kvstore::kMaxKvTransformBits)) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "wire bits per value %g outside (0, %d]", x, kvstore::kMaxKvTransformBits));
        }
      }
    }
  }
  // Arm 0 is the fp16 reference; the presets follow, each then with every wire budget.
  std::vector<Arm> arms(1);
  SLUICE_ASSIGN_OR_RETURN(arms[0].preset, kvstore::FindKvPreset("fp16", head_dim));
  for (const std::string& spec : o.presets) {
    SLUICE_ASSIGN_OR_RETURN(const kvstore::KvPreset preset, kvstore::FindKvPreset(spec, head_dim));
    arms.emplace_back().preset = preset;
    for (const EvalOptions::WireBudget& b : o.wire_bits) {
      Arm& arm = arms.emplace_back();
      arm.preset = preset;
      arm.wire = b;
    }
  }
  if (o.residual >= 0) {
    for (Arm& arm : arms) arm.preset.residual = o.residual;
  }
  for (const std::string& spec : o.trials) {
    Arm& arm = arms.emplace_back();
    SLUICE_ASSIGN_OR_RETURN(arm.trial, ParseTrialFormat(spec));
    // Checks the format against the model's shapes before any window runs.
    SLUICE_RETURN_IF_ERROR(TrialKvCache::Create(*arm.trial, c, backend, o.trial_bases).status());
  }
  if (o.budget >= 0) {
    if (o.budget == 0 || o.budget > 1) {
      return absl::InvalidArgumentError(absl::StrFormat("--budget %g outside (0, 1]", o.budget));
    }
    for (Arm& arm : arms) {
      if (arm.preset.policy.kind != kvstore::KvPolicyKind::kNone)
        arm.preset.policy.budget = o.budget;
    }
  }
  const uint32_t calibration_checksum =
      o.calibration ? kvstore::KvTransformCalibrationChecksum(*o.calibration) : 0;
  const int64_t half = o.context / 2, n = static_cast<int64_t>(starts.size());
  const int64_t total = n * (o.context - half);
  int64_t done = 0;
  for (int64_t b0 = 0; b0 < n; b0 += o.batch) {
    const int64_t bn = std::min(o.batch, n - b0);
    for (Arm& arm : arms) {
      if (arm.trial) {
        SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<TrialKvCache> trial,
                                TrialKvCache::Create(*arm.trial, c, backend, o.trial_bases));
        arm.trial_cache = trial.get();
        arm.owner = std::move(trial);
      } else {
        SLUICE_ASSIGN_OR_RETURN(
            const int64_t pages,
            kvstore::PagesForSequence(arm.preset, c.layers, c.kv_heads, o.context));
        SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<kvstore::PagedKvCache> cache,
                                kvstore::PagedKvCache::Create({.layers = c.layers,
                                                               .heads = c.heads,
                                                               .kv_heads = c.kv_heads,
                                                               .head_dim = c.head_dim,
                                                               .preset = arm.preset,
                                                               .pages = pages * bn},
                                                              backend));
        arm.cache = cache.get();
        if (arm.wire.k > 0) {
          arm.owner = std::make_unique<kvstore::WireEncodingKvCache>(
              std::move(cache), kvstore::WireEncodingKvCache::Pass::kDecoded);
        } else {
          arm.owner = std::move(cache);
        }
      }
      arm.logits.resize(bn * c.vocab);
      std::vector<model::ForwardEntry> prompts;
      auto* wire =
          arm.wire.k > 0 ? static_cast<kvstore::WireEncodingKvCache*>(arm.owner.get()) : nullptr;
      for (int64_t b = 0; b < bn; ++b) {
        SLUICE_RETURN_IF_ERROR(arm.owner->AddSequence(b, o.context));
        prompts.push_back({b, absl::MakeConstSpan(tokens.data() + starts[b0 + b], half)});
        if (wire == nullptr) continue;
        // The prompt crosses as a decode worker would get it: sinks and the window the cache
        // keeps exact, the rest coded.
        SLUICE_RETURN_IF_ERROR(
            wire->StartEncoding(b, {.calibration = o.calibration,
                                    .calibration_checksum = calibration_checksum,
                                    .model = c,
                                    .key_bits = arm.wire.k,
                                    .value_bits = arm.wire.v,
                                    .shape = {.tokens = half,
                                              .sinks = o.wire_sinks,
                                              .tail = arm.cache->WindowAfterPrompt(half)}}));
      }
      SLUICE_RETURN_IF_ERROR(llama.Forward(prompts, *arm.owner, arm.logits.data()));
      if (wire != nullptr) {
        for (int64_t b = 0; b < bn; ++b) {
          arm.wire_fp16_bytes += static_cast<double>(wire->EncodedFp16Bytes(b));
          SLUICE_ASSIGN_OR_RETURN(const std::string stream, wire->FinishEncoding(b));
          arm.wire_bytes += static_cast<double>(stream.size());
        }
      } else {
        const Held h = HeldNow(arm);
        arm.wire_bytes += h.held;
        arm.wire_fp16_bytes += h.fp16;
      }
    }
    for (int64_t t = half; t < o.context; ++t) {
      for (int64_t b = 0; b < bn; ++b) {
        const int32_t target = tokens[starts[b0 + b] + t];
        const float* ref = arms[0].logits.data() + b * c.vocab;
        for (size_t i = 1; i < arms.size(); ++i) {
          arms[i].totals.Add(
              CompareLogits(arms[i].logits.data() + b * c.vocab, ref, c.vocab, target));
        }
      }
      done += bn;
      if (o.progress) o.progress(done, total);
      if (t + 1 == o.context) break;
      std::vector<model::ForwardEntry> step;
      for (int64_t b = 0; b < bn; ++b) {
        step.push_back({b, absl::MakeConstSpan(tokens.data() + starts[b0 + b] + t, 1)});
      }
      for (Arm& arm : arms) {
        SLUICE_RETURN_IF_ERROR(llama.Forward(step, *arm.owner, arm.logits.data()));
      }
    }
    for (Arm& arm : arms) {
      const Held h = HeldNow(arm);
      arm.held_bytes += h.held;
      arm.fp16_bytes += h.fp16;
      arm.pages += h.pages;
      arm.cache = nullptr;
      arm.trial_cache = nullptr;
      arm.owner.reset();
    }
  }
  std::vector<EvalResult> out;
  for (size_t i = 1; i < arms.size(); ++i) {
    const Arm& a = arms[i];
    // "+kvtcK/V", or "+kvtcxK/V" with cross-layer prediction.
    const bool cross = o.calibration != nullptr && kvstore::HasKvPredictors(*o.calibration);
    const std::string name = a.trial        ? "trial:" + a.trial->spec
                             : a.wire.k > 0 ? absl::StrFormat("%s+kvtc%s%g/%g", a.preset.name,
                                                              cross ? "x" : "", a.wire.k, a.wire.v)
                                            : a.preset.name;
    out.push_back({.preset = name,
                   .tokens = a.totals.count(),
                   .windows = n,
                   .ppl = a.totals.ppl(),
                   .ppl_fp16 = a.totals.ppl_ref(),
                   .kl = a.totals.kl(),
                   .top1 = a.totals.top1(),
                   .ratio = a.held_bytes > 0 ? a.fp16_bytes / a.held_bytes : 0,
                   .wire_ratio = a.wire_bytes > 0 ? a.wire_fp16_bytes / a.wire_bytes : 0,
                   .pages = a.pages / n});
  }
  return out;
}

int PickCalibrated(const std::vector<EvalResult>& results, double max_dppl, double min_top1) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    const EvalResult& r = results[i];
    const bool ok = 100.0 * (r.ppl / r.ppl_fp16 - 1) <= max_dppl && r.top1 >= min_top1;
    if (ok && (best < 0 || r.ratio > results[best].ratio)) best = i;
  }
  if (best >= 0) return best;
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    if (best < 0 || results[i].kl < results[best].kl) best = i;
  }
  return best;
}

}  // namespace sluice::tools
