#include "tools/trial_kv_cache.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "kernels/ggml_quant.h"
#include "kernels/kv_format.h"
#include "kernels/ref/kv_quant.h"
#include "kvstore/cache/recording_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "kvstore/wire/kv_transform_calibration.h"

namespace sluice::tools {
namespace {

constexpr int64_t kPageBytes = 16384;
// A tc page's own bytes besides its token groups: valid bits and a header, as one-tier pages'.
constexpr int64_t kPageHeaderBytes = 64;

float RoundFp16(float x) { return kernels::Fp16ToFloat(kernels::FloatToFp16(x)); }

int64_t Align64(int64_t x) { return (x + 63) / 64 * 64; }

absl::Status BadSetting(std::string_view spec, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat("trial format %s: %s", spec, what));
}

}  // namespace

absl::StatusOr<TrialFormat> ParseTrialFormat(std::string_view spec) {
  TrialFormat f;
  f.spec = std::string(spec);
  const std::vector<std::string> parts = absl::StrSplit(std::string(spec), ':');
  if (parts[0] == "kivi") {
    f.kind = TrialFormat::Kind::kKivi;
  } else if (parts[0] == "tc") {
    f.kind = TrialFormat::Kind::kTransform;
  } else {
    return BadSetting(spec, absl::StrFormat("unknown format '%s' (kivi, tc)", parts[0]));
  }
  const bool tc = f.kind == TrialFormat::Kind::kTransform;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::vector<std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    if (kv.size() != 2) return BadSetting(spec, absl::StrFormat("'%s' is not key=value", parts[i]));
    const std::string& key = kv[0];
    const std::string& value = kv[1];
    auto integer = [&](int64_t lo, int64_t hi, int64_t& out) -> absl::Status {
      if (!absl::SimpleAtoi(value, &out) || out < lo || out > hi) {
        return BadSetting(
            spec, absl::StrFormat("%s=%s is not an integer in [%d, %d]", key, value, lo, hi));
      }
      return absl::OkStatus();
    };
    int64_t x = 0;
    if ((key == "kb" || key == "vb") && tc) {
      double b = 0;
      if (!absl::SimpleAtod(value, &b) || !(b > 0 && b <= kvstore::kMaxKvTransformBits)) {
        return BadSetting(spec, absl::StrFormat("%s=%s outside (0, %d]", key, value,
                                                kvstore::kMaxKvTransformBits));
      }
      (key == "kb" ? f.k_budget : f.v_budget) = b;
    } else if (key == "kb" || key == "vb") {
      SLUICE_RETURN_IF_ERROR(integer(1, 8, x));
      (key == "kb" ? f.k_bits : f.v_bits) = static_cast<int>(x);
    } else if ((key == "kg" || key == "vg") && !tc) {
      SLUICE_RETURN_IF_ERROR(integer(1, 4096, x));
      (key == "kg" ? f.k_group : f.v_group) = static_cast<int>(x);
    } else if (key == "steps" && tc) {
      if (value == "calib") {
        f.steps = TrialFormat::Steps::kCalibrated;
      } else if (value == "group") {
        f.steps = TrialFormat::Steps::kGroup;
      } else if (value == "minmax") {
        f.steps = TrialFormat::Steps::kMinMax;
      } else {
        return BadSetting(spec, absl::StrFormat("steps=%s is not calib, group or minmax", value));
      }
    } else if (key == "clip" && tc) {
      SLUICE_RETURN_IF_ERROR(integer(0, 1, x));
      f.clip = x == 1;
    } else if (key == "rope") {
      if (value != "pre" && value != "post") {
        return BadSetting(spec, absl::StrFormat("rope=%s is not pre or post", value));
      }
      f.keys_pre_rope = value == "pre";
    } else if (key == "window") {
      SLUICE_RETURN_IF_ERROR(integer(0, 1 << 20, f.window));
    } else if (key == "group") {
      SLUICE_RETURN_IF_ERROR(integer(1, 4096, f.group));
    } else if (key == "sinks") {
      SLUICE_RETURN_IF_ERROR(integer(0, 1 << 20, f.sinks));
    } else if (key == "exact") {
      if (value != "fp16" && value != "fp32") {
        return BadSetting(spec, absl::StrFormat("exact=%s is not fp16 or fp32", value));
      }
      f.fp32_exact = value == "fp32";
    } else {
      return BadSetting(spec, absl::StrFormat("unknown setting '%s' for %s", key, parts[0]));
    }
  }
  return f;
}

absl::StatusOr<TrialBases> FitTrialBases(model::LlamaModel& llama, kernels::Backend& backend,
                                         const model::GgufFile& gguf,
                                         const std::vector<int32_t>& tokens) {
  const model::LlamaConfig& c = llama.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("calibration takes at least 2 tokens, not %d", n));
  }
  SLUICE_ASSIGN_OR_RETURN(const std::unique_ptr<kvstore::RecordingKvCache> rec,
                          kvstore::RecordFullPrecisionKv(llama, backend, tokens));
  const int32_t dim = static_cast<int32_t>(c.kv_heads * c.head_dim);
  TrialBases out;
  for (int layer = 0; layer < c.layers; ++layer) {
    std::vector<float> k = rec->k(layer);
    SLUICE_ASSIGN_OR_RETURN(kvstore::KvTransformBasis post,
                            kvstore::FitKvTransformBasis(k.data(), n, dim));
    kvstore::RotateKeyRows(c, k.data(), n, 0, /*inverse=*/true);
    SLUICE_ASSIGN_OR_RETURN(kvstore::KvTransformBasis pre,
                            kvstore::FitKvTransformBasis(k.data(), n, dim));
    SLUICE_ASSIGN_OR_RETURN(const std::vector<double> metric,
                            kvstore::KvValueMetric(gguf, c, layer));
    SLUICE_ASSIGN_OR_RETURN(kvstore::KvTransformBasis v,
                            kvstore::FitKvTransformBasis(rec->v(layer).data(), n, dim, metric));
    out.k_pre.push_back(std::move(pre));
    out.k_post.push_back(std::move(post));
    out.v.push_back(std::move(v));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TrialKvCache>> TrialKvCache::Create(const TrialFormat& format,
                                                                   const model::LlamaConfig& config,
                                                                   kernels::Backend& backend,
                                                                   const TrialBases* bases) {
  if (backend.memory_space() != kernels::MemorySpace::kHost) {
    return absl::UnimplementedError("trial formats run on host-memory backends only (cpu)");
  }
  std::unique_ptr<TrialKvCache> cache(new TrialKvCache(format, config, backend, bases));
  SLUICE_RETURN_IF_ERROR(cache->Init());
  return cache;
}

absl::Status TrialKvCache::Init() {
  dim_ = c_.kv_heads * c_.head_dim;
  if (f_.kind == TrialFormat::Kind::kKivi) {
    if (f_.group % f_.k_group != 0) {
      return BadSetting(f_.spec, absl::StrFormat("key groups of %d tokens do not divide the flush "
                                                 "group of %d (set group=)",
                                                 f_.k_group, f_.group));
    }
    // The pages the one-tier preset with these codes lays out.
    const absl::StatusOr<kvstore::KvPreset> preset =
        kvstore::FindKvPreset(absl::StrFormat("sluice:k_bits=%d:k_group=%d:v_bits=%d:v_group=%d",
                                              f_.k_bits, f_.k_group, f_.v_bits, f_.v_group),
                              static_cast<int32_t>(c_.head_dim));
    if (!preset.ok()) return BadSetting(f_.spec, std::string(preset.status().message()));
    SLUICE_ASSIGN_OR_RETURN(const kernels::KvPageLayout layout,
                            kernels::ComputePageLayout(preset->high));
    pages_.assign(c_.layers, {.tokens = layout.tokens, .bytes = preset->high.page_bytes});
    return absl::OkStatus();
  }
  if (bases_ == nullptr || static_cast<int64_t>(bases_->v.size()) != c_.layers ||
      static_cast<int64_t>(bases_->k_pre.size()) != c_.layers ||
      static_cast<int64_t>(bases_->k_post.size()) != c_.layers || bases_->v[0].dim != dim_) {
    return BadSetting(f_.spec,
                      absl::StrFormat("needs bases of %d layers of dim %d", c_.layers, dim_));
  }
  for (int layer = 0; layer < c_.layers; ++layer) {
    const kvstore::KvTransformBasis& kb =
        f_.keys_pre_rope ? bases_->k_pre[layer] : bases_->k_post[layer];
    const kvstore::KvTransformBasis& vb = bases_->v[layer];
    const std::vector<double> kvar(kb.variance.begin(), kb.variance.end());
    const std::vector<double> vvar(vb.variance.begin(), vb.variance.end());
    k_widths_.push_back(kvstore::AllocateKvTransformBits(kvar, f_.k_budget));
    v_widths_.push_back(kvstore::AllocateKvTransformBits(vvar, f_.v_budget));
    // A page of one layer holds whole flush groups of key and value rows (each row's codes
    // packed to whole bytes) and, with per-group steps, each component's mean (every one) and
    // step (coded ones), fp16.
    int64_t row_bytes = 0, meta = 0;
    for (const std::vector<uint8_t>* w : {&k_widths_.back(), &v_widths_.back()}) {
      int64_t bits = 0, coded = 0;
      for (uint8_t b : *w) {
        bits += b;
        coded += b > 0;
      }
      row_bytes += (bits + 7) / 8;
      if (f_.steps != TrialFormat::Steps::kCalibrated) meta += 2 * dim_ + 2 * coded;
    }
    const int64_t group_bytes = f_.group * row_bytes + meta;
    const int64_t groups = (kPageBytes - kPageHeaderBytes) / group_bytes;
    if (groups < 1) {
      return BadSetting(f_.spec, absl::StrFormat("a group of %d tokens takes %d bytes, more than "
                                                 "a page",
                                                 f_.group, group_bytes));
    }
    pages_.push_back(
        {.tokens = groups * f_.group, .bytes = Align64(groups * group_bytes + kPageHeaderBytes)});
  }
  return absl::OkStatus();
}

absl::Status TrialKvCache::AddSequence(int64_t seq, int64_t max_tokens) {
  if (seqs_.contains(seq)) return absl::AlreadyExistsError(absl::StrFormat("seq %d", seq));
  Seq& s = seqs_[seq];
  s.max_tokens = max_tokens;
  s.coded_end = f_.sinks;
  s.k.assign(c_.layers, std::vector<float>(static_cast<size_t>(max_tokens * dim_)));
  s.v.assign(c_.layers, std::vector<float>(static_cast<size_t>(max_tokens * dim_)));
  return absl::OkStatus();
}

absl::Status TrialKvCache::RemoveSequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("seq %d", seq));
  for (const Entry& e : step_) {
    if (open_ && e.seq == &it->second) {
      return absl::FailedPreconditionError("the open step holds it");
    }
  }
  seqs_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TrialKvCache::Length(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("seq %d", seq));
  return it->second.length;
}

absl::Status TrialKvCache::BeginStep(absl::Span<const model::StepEntry> batch) {
  if (open_) return absl::FailedPreconditionError("a step is open");
  step_.clear();
  step_rows_ = 0;
  for (const model::StepEntry& e : batch) {
    auto it = seqs_.find(e.seq);
    if (it == seqs_.end()) return absl::NotFoundError(absl::StrFormat("seq %d", e.seq));
    if (e.tokens < 1) return absl::InvalidArgumentError("an entry without tokens");
    if (it->second.length + e.tokens > it->second.max_tokens) {
      return absl::ResourceExhaustedError(absl::StrFormat("seq %d outgrows its room", e.seq));
    }
    step_.push_back({.seq = &it->second, .tokens = e.tokens, .row = step_rows_});
    step_rows_ += e.tokens;
  }
  open_ = true;
  return absl::OkStatus();
}

absl::Status TrialKvCache::Write(int layer, const float* k, const float* v) {
  if (!open_) return absl::FailedPreconditionError("no step is open");
  for (const Entry& e : step_) {
    const int64_t at = e.seq->length * dim_, from = e.row * dim_, n = e.tokens * dim_;
    for (int64_t i = 0; i < n; ++i) {
      e.seq->k[layer][at + i] = f_.fp32_exact ? k[from + i] : RoundFp16(k[from + i]);
      e.seq->v[layer][at + i] = f_.fp32_exact ? v[from + i] : RoundFp16(v[from + i]);
    }
  }
  return absl::OkStatus();
}

absl::Status TrialKvCache::Attend(int layer, const float* q, float* out) {
  if (!open_) return absl::FailedPreconditionError("no step is open");
  const int64_t q_row = c_.heads * c_.head_dim;
  for (const Entry& e : step_) {
    SLUICE_RETURN_IF_ERROR(
        backend_.Attention({.q = q + e.row * q_row,
                            .k = e.seq->k[layer].data(),
                            .v = e.seq->v[layer].data(),
                            .out = out + e.row * q_row,
                            .q_tokens = e.tokens,
                            .kv_tokens = e.seq->length + e.tokens,
                            .q_start = e.seq->length,
                            .heads = c_.heads,
                            .kv_heads = c_.kv_heads,
                            .head_dim = c_.head_dim,
                            .scale = 1.f / std::sqrt(static_cast<float>(c_.head_dim))}));
  }
  return absl::OkStatus();
}

int64_t TrialKvCache::FlushCount(const Seq& s) const {
  const int64_t movable = s.length - s.coded_end - f_.window;
  return movable > 0 ? movable / f_.group * f_.group : 0;
}

absl::Status TrialKvCache::Commit() {
  if (!open_) return absl::FailedPreconditionError("no step is open");
  for (const Entry& e : step_) {
    Seq& s = *e.seq;
    s.length += e.tokens;
    const int64_t n = FlushCount(s);
    if (n == 0) continue;
    for (int layer = 0; layer < c_.layers; ++layer) {
      float* k = s.k[layer].data() + s.coded_end * dim_;
      float* v = s.v[layer].data() + s.coded_end * dim_;
      if (f_.kind == TrialFormat::Kind::kKivi) {
        CodeKivi(layer, s.coded_end, n, k, v);
      } else {
        CodeTransform(layer, /*keys=*/true, s.coded_end, n, k);
        CodeTransform(layer, /*keys=*/false, s.coded_end, n, v);
      }
    }
    s.coded_end += n;
  }
  step_.clear();
  open_ = false;
  return absl::OkStatus();
}

void TrialKvCache::AbortStep() {
  step_.clear();
  open_ = false;
}

void TrialKvCache::CodeKivi(int layer, int64_t start, int64_t n, float* k, float* v) const {
  const int k_max = (1 << f_.k_bits) - 1, v_max = (1 << f_.v_bits) - 1;
  auto code = [](float x, const kernels::ref::IntGroupParams& g, int max_code) {
    return kernels::Fp16ToFloat(g.zero16) +
           static_cast<float>(kernels::ref::IntCode(x, g, max_code)) *
               kernels::Fp16ToFloat(g.scale16);
  };
  if (f_.keys_pre_rope) kvstore::RotateKeyRows(c_, k, n, start, /*inverse=*/true);
  // Keys: per channel, over k_group tokens.
  for (int64_t t0 = 0; t0 < n; t0 += f_.k_group) {
    for (int64_t j = 0; j < dim_; ++j) {
      float mn = k[t0 * dim_ + j], mx = mn;
      for (int64_t t = t0; t < t0 + f_.k_group; ++t) {
        mn = std::min(mn, k[t * dim_ + j]);
        mx = std::max(mx, k[t * dim_ + j]);
      }
      const kernels::ref::IntGroupParams g = kernels::ref::MakeIntGroupParams(mn, mx, k_max);
      for (int64_t t = t0; t < t0 + f_.k_group; ++t)
        k[t * dim_ + j] = code(k[t * dim_ + j], g, k_max);
    }
  }
  if (f_.keys_pre_rope) kvstore::RotateKeyRows(c_, k, n, start, /*inverse=*/false);
  // Values: per token, over v_group channels (groups never straddle heads: v_group divides
  // head_dim, checked by the preset's layout).
  for (int64_t t = 0; t < n; ++t) {
    float* row = v + t * dim_;
    for (int64_t j0 = 0; j0 < dim_; j0 += f_.v_group) {
      float mn = row[j0], mx = mn;
      for (int64_t j = j0; j < j0 + f_.v_group; ++j) {
        mn = std::min(mn, row[j]);
        mx = std::max(mx, row[j]);
      }
      const kernels::ref::IntGroupParams g = kernels::ref::MakeIntGroupParams(mn, mx, v_max);
      for (int64_t j = j0; j < j0 + f_.v_group; ++j) row[j] = code(row[j], g, v_max);
    }
  }
}

void TrialKvCache::CodeTransform(int layer, bool keys, int64_t start, int64_t n,
                                 float* rows) const {
  const kvstore::KvTransformBasis& basis = !keys              ? bases_->v[layer]
                                           : f_.keys_pre_rope ? bases_->k_pre[layer]
                                                              : bases_->k_post[layer];
  const std::vector<uint8_t>& widths = keys ? k_widths_[layer] : v_widths_[layer];
  const bool unrope = keys && f_.keys_pre_rope;
  const int d = static_cast<int>(dim_), rows_n = static_cast<int>(n);
  if (unrope) kvstore::RotateKeyRows(c_, rows, n, start, /*inverse=*/true);
  std::vector<float> centred(static_cast<size_t>(n * dim_)), coef(static_cast<size_t>(n * dim_));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < dim_; ++j) centred[t * dim_ + j] = rows[t * dim_ + j] - basis.mean[j];
  }
  // coef [n, dim] = centred encode^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows_n, d, d, 1.f, centred.data(), d,
              basis.encode.data(), d, 0.f, coef.data(), d);
  for (int64_t i = 0; i < dim_; ++i) {
    const int w = widths[i];
    const int lo = !f_.clip ? -(1 << 20) : w > 0 ? -(1 << (w - 1)) : 0;
    const int hi = !f_.clip ? 1 << 20 : w > 0 ? (1 << (w - 1)) - 1 : 0;
    for (int64_t g0 = 0; g0 < n; g0 += f_.group) {
      float* x0 = coef.data() + g0 * dim_ + i;  // the group's coefficients, dim_ apart
      double m = 0, var = 0;
      float mn = x0[0], mx = x0[0];
      for (int64_t t = 0; t < f_.group; ++t) {
        m += x0[t * dim_];
        mn = std::min(mn, x0[t * dim_]);
        mx = std::max(mx, x0[t * dim_]);
      }
      m /= static_cast<double>(f_.group);
      for (int64_t t = 0; t < f_.group; ++t) var += (x0[t * dim_] - m) * (x0[t * dim_] - m);
      var /= static_cast<double>(f_.group);
      if (w == 0) {
        // The component is its mean: the group's (stored) or the calibration's (0).
        const float mean =
            f_.steps == TrialFormat::Steps::kCalibrated ? 0.f : RoundFp16(static_cast<float>(m));
        for (int64_t t = 0; t < f_.group; ++t) x0[t * dim_] = mean;
        continue;
      }
      if (f_.steps == TrialFormat::Steps::kMinMax) {
        const int max_code = (1 << w) - 1;
        const kernels::ref::IntGroupParams g = kernels::ref::MakeIntGroupParams(mn, mx, max_code);
        for (int64_t t = 0; t < f_.group; ++t) {
          x0[t * dim_] = kernels::Fp16ToFloat(g.zero16) +
                         static_cast<float>(kernels::ref::IntCode(x0[t * dim_], g, max_code)) *
                             kernels::Fp16ToFloat(g.scale16);
        }
        continue;
      }
      float mean = 0.f, step = 0.f;
      if (f_.steps == TrialFormat::Steps::kGroup) {
        mean = RoundFp16(static_cast<float>(m));
        step = RoundFp16(std::max(
            static_cast<float>(kvstore::KvTransformGaussianStep(w) * std::sqrt(var)), 6.2e-5f));
      } else {
        step = static_cast<float>(kvstore::KvTransformGaussianStep(w) *
                                  std::sqrt(std::max(static_cast<double>(basis.variance[i]), 0.0)));
      }
      for (int64_t t = 0; t < f_.group; ++t) {
        float& x = x0[t * dim_];
        if (step <= 0.f) {
          x = mean;
          continue;
        }
        const int q = std::clamp(static_cast<int>(std::floor((x - mean) / step)), lo, hi);
        x = mean + (static_cast<float>(q) + 0.5f) * step;
      }
    }
  }
  // rows [n, dim] = mean + coef decode.
  for (int64_t t = 0; t < n; ++t) std::copy(basis.mean.begin(), basis.mean.end(), rows + t * dim_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows_n, d, d, 1.f, coef.data(), d,
              basis.decode.data(), d, 1.f, rows, d);
  if (unrope) kvstore::RotateKeyRows(c_, rows, n, start, /*inverse=*/false);
}

int64_t TrialKvCache::held_bytes() const {
  const int64_t exact_row = dim_ * 2 * (f_.fp32_exact ? 4 : 2);  // K and V
  const int64_t lists = f_.kind == TrialFormat::Kind::kKivi ? c_.kv_heads : 1;
  int64_t bytes = 0;
  for (const auto& [id, s] : seqs_) {
    const int64_t coded = std::max<int64_t>(0, s.coded_end - f_.sinks);
    bytes += (s.length - coded) * exact_row * c_.layers;
    for (const PageGeometry& p : pages_) {
      bytes += lists * ((coded + p.tokens - 1) / p.tokens) * p.bytes;
    }
  }
  return bytes;
}

std::string TrialKvCache::Describe() const {
  if (f_.kind == TrialFormat::Kind::kKivi) {
    return absl::StrFormat("%s: pages of %d tokens in %d bytes per kv-head", f_.spec,
                           pages_[0].tokens, pages_[0].bytes);
  }
  double coded[2] = {0, 0}, bits[2] = {0, 0};
  for (int layer = 0; layer < c_.layers; ++layer) {
    for (int side = 0; side < 2; ++side) {
      for (uint8_t b : side == 0 ? k_widths_[layer] : v_widths_[layer]) {
        coded[side] += b > 0;
        bits[side] += b;
      }
    }
  }
  const double layers = c_.layers;
  return absl::StrFormat(
      "%s: keys code %.1f of %d components (%.0f bits a row), values %.1f (%.0f bits); pages of "
      "%d tokens (layer 0)",
      f_.spec, coded[0] / layers, dim_, bits[0] / layers, coded[1] / layers, bits[1] / layers,
      pages_[0].tokens);
}

int64_t TrialKvCache::fp16_bytes() const {
  int64_t bytes = 0;
  for (const auto& [id, s] : seqs_) bytes += s.length * dim_ * 2 * 2 * c_.layers;
  return bytes;
}

}  // namespace sluice::tools
