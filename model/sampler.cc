#include "model/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace sluice::model {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(absl::StrFormat("temperature=%g must be >= 0", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrFormat("top_k=%d must be >= 0", top_k));
  if (!(top_p > 0.f && top_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrFormat("top_p=%g must be in (0, 1]", top_p));
  }
  if (!(min_p >= 0.f && min_p < 1.f)) {
    return absl::InvalidArgumentError(absl::StrFormat("min_p=%g must be in [0, 1)", min_p));
  }
  if (!(repetition_penalty > 0.f) || !std::isfinite(repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("repetition_penalty=%g must be > 0", repetition_penalty));
  }
  if (max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("max_tokens=%d must be >= 0", max_tokens));
  }
  for (const std::string& s : stop_strings) {
    if (s.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Sample(absl::Span<const float> logits, absl::Span<const int32_t> history) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  candidates_.resize(vocab);
  for (int32_t i = 0; i < vocab; ++i) candidates_[i] = {logits[i], i};
  if (params_.repetition_penalty != 1.f) {
    std::vector<bool> seen(vocab, false);
    for (int32_t t : history) {
      if (t < 0 || t >= vocab || seen[t]) continue;
      seen[t] = true;
      float& l = candidates_[t].first;
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  auto best = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (params_.temperature == 0.f) {
    return std::min_element(candidates_.begin(), candidates_.end(), best)->second;
  }

  // Sort the candidates that can survive top-k (all of them without top-k).
  size_t keep = candidates_.size();
  if (params_.top_k > 0) keep = std::min<size_t>(keep, params_.top_k);
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), best);
  candidates_.resize(keep);

  // Softmax at temperature over the survivors.
  const float inv_t = 1.f / params_.temperature;
  const float max_logit = candidates_[0].first;
  double total = 0;
  for (auto& [l, id] : candidates_) total += (l = std::exp((l - max_logit) * inv_t));
  for (auto& [p, id] : candidates_) p = static_cast<float>(p / total);

  // min-p, then top-p, both relative to the sorted probabilities.
  if (params_.min_p > 0.f) {
    const float floor = params_.min_p * candidates_[0].first;
    size_t n = 1;
    while (n < candidates_.size() && candidates_[n].first >= floor) ++n;
    candidates_.resize(n);
  }
  if (params_.top_p < 1.f) {
    double mass = 0;
    size_t n = 0;
    while (n < candidates_.size()) {
      mass += candidates_[n++].first;
      if (mass >= params_.top_p) break;
    }
    candidates_.resize(n);
  }
  double kept = 0;
  for (const auto& [p, id] : candidates_) kept += p;
  double r = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  for (const auto& [p, id] : candidates_) {
    r -= p;
    if (r <= 0) return id;
  }
  return candidates_.back().second;
}

void Sampler::Skip(int samples) {
  // Greedy draws nothing; sampling draws one number a token (uniform_real_distribution<double>
  // over a 64-bit engine takes one engine value).
  if (params_.temperature != 0.f && samples > 0) rng_.discard(samples);
}

StopChecker::Reason StopChecker::Check(int32_t token, int generated, const std::string& text,
                                       size_t* text_end) const {
  *text_end = text.size();
  if (std::find(params_.stop_tokens.begin(), params_.stop_tokens.end(), token) !=
      params_.stop_tokens.end()) {
    return Reason::kStopToken;
  }
  size_t first = std::string::npos;
  for (const std::string& s : params_.stop_strings) first = std::min(first, text.find(s));
  if (first != std::string::npos) {
    *text_end = first;
    return Reason::kStopString;
  }
  if (generated >= params_.max_tokens) return Reason::kMaxTokens;
  return Reason::kNone;
}

size_t StopChecker::HoldBack(const std::string& text) const {
  size_t hold = 0;
  for (const std::string& s : params_.stop_strings) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n) {
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

}  // namespace sluice::model
