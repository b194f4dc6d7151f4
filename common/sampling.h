// The sampling a request asks for, as the workers run it: the rpc message's fields in a
// model::SamplingParams, checked (the model's rules, and skip_samples in [0, kMaxSkipSamples]:
// each skipped draw costs the sampler a step of its engine).
#ifndef SLUICE_COMMON_SAMPLING_H_
#define SLUICE_COMMON_SAMPLING_H_

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "model/sampler.h"
#include "proto/sluice.pb.h"

namespace sluice {

inline constexpr int kMaxSkipSamples = 1 << 20;
// Generations one request may fork from its prompt (OpenAI's n).
inline constexpr int kMaxChoices = 16;

// A message's choices field: 0 (unset) counts as 1; InvalidArgument outside [0, kMaxChoices].
inline absl::StatusOr<int> CheckedChoices(int32_t choices) {
  if (choices < 0 || choices > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrFormat("choices=%d must be in [1, %d]", choices, kMaxChoices));
  }
  return choices == 0 ? 1 : choices;
}

inline model::SamplingParams SamplingFromProto(const rpc::SamplingParams& sp) {
  model::SamplingParams p;
  p.temperature = sp.temperature();
  p.top_k = sp.top_k();
  p.top_p = sp.top_p();
  p.min_p = sp.min_p();
  p.repetition_penalty = sp.repetition_penalty();
  p.seed = sp.seed();
  p.max_tokens = sp.max_tokens();
  p.stop_tokens.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
  return p;
}

// The sampling of choice `choice` of a request with several (OpenAI's n): the request's, with
// the seed plus `choice`, so that choice i draws as one request of seed + i would.
inline rpc::SamplingParams ChoiceSampling(const rpc::SamplingParams& sp, int choice) {
  rpc::SamplingParams out = sp;
  out.set_seed(sp.seed() + static_cast<uint64_t>(choice));
  return out;
}

// InvalidArgument naming the field a worker cannot run.
inline absl::StatusOr<model::SamplingParams> CheckedSampling(const rpc::SamplingParams& sp) {
  model::SamplingParams p = SamplingFromProto(sp);
  if (absl::Status st = p.Validate(); !st.ok()) return st;
  if (sp.skip_samples() < 0 || sp.skip_samples() > kMaxSkipSamples) {
    return absl::InvalidArgumentError(
        absl::StrFormat("skip_samples=%d must be in [0, %d]", sp.skip_samples(), kMaxSkipSamples));
  }
  return p;
}

}  // namespace sluice

#endif  // SLUICE_COMMON_SAMPLING_H_
