// Picks the next token from logits: greedy, or temperature sampling filtered by top-k, top-p
// and min-p, with a repetition penalty; seeded for reproducibility. Stop conditions (stop
// tokens, stop strings, max tokens) are tracked by `StopChecker`.
#ifndef SLUICE_MODEL_SAMPLER_H_
#define SLUICE_MODEL_SAMPLER_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::model {

struct SamplingParams {
  float temperature = 1.f;         // 0 = greedy
  int top_k = 0;                   // 0 = all
  float top_p = 1.f;               // nucleus mass kept, in (0, 1]
  float min_p = 0.f;               // drop tokens below min_p * p(best), in [0, 1)
  float repetition_penalty = 1.f;  // > 0; 1 = off (CTRL-style, as in HF and llama.cpp)
  uint64_t seed = 0;
  int max_tokens = 128;
  std::vector<int32_t> stop_tokens;
  std::vector<std::string> stop_strings;

  // InvalidArgument naming the field when out of range.
  absl::Status Validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Chooses a token from logits [vocab]. `history` holds the prompt and generated tokens (for
  // the repetition penalty).
  int32_t Sample(absl::Span<const float> logits, absl::Span<const int32_t> history);

  // Moves the random stream past `samples` tokens sampled elsewhere with the same parameters
  // (a decode worker going on from the token a prefill worker sampled), so a seeded request
  // draws the same numbers whichever workers serve it.
  void Skip(int samples);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Decides when generation ends.
class StopChecker {
 public:
  enum class Reason { kNone, kStopToken, kStopString, kMaxTokens };

  explicit StopChecker(const SamplingParams& params) : params_(params) {}

  // Called with each generated token and the full generated text so far. When a stop string
  // is found, `text_end` is where the visible text ends (the stop string is not shown).
  Reason Check(int32_t token, int generated, const std::string& text, size_t* text_end) const;

  // How many trailing bytes of `text` could still be the start of a stop string, and must be
  // held back from a stream until more text arrives.
  size_t HoldBack(const std::string& text) const;

 private:
  SamplingParams params_;
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_SAMPLER_H_
