#include "kvstore/policy/leankv.h"

#include <algorithm>

#include "common/status_macros.h"

namespace sluice::kvstore::policy {

float LeanKvPolicy::Significance(const ListState& ls, int64_t position, int64_t length) const {
  const int64_t group = shape().group();
  if (static_cast<int64_t>(ls.score.size()) < (position + 1) * group) return 0.f;
  float best = 0.f;
  for (int64_t g = 0; g < group; ++g) best = std::max(best, ls.score[position * group + g]);
  // Queries position .. length - 1 saw it.
  return best / static_cast<float>(length - position);
}

TierChoice LeanKvPolicy::ChooseTiers(SequenceView& seq, int64_t flush) const {
  const float n = static_cast<float>(seq.length());
  const float high = config().alpha_high / n, low = config().alpha_low / n;
  TierChoice choice(seq.lists(), std::vector<int8_t>(flush, 0));
  for (int64_t i = 0; i < seq.lists(); ++i) {
    const ListState& ls = seq.list(i);
    for (int64_t t = 0; t < flush; ++t) {
      const float score = Significance(ls, seq.compressed() + t, seq.length());
      choice[i][t] = score >= high ? 0 : score >= low ? 1 : -1;
    }
  }
  return choice;
}

absl::Status LeanKvPolicy::AfterCommit(SequenceView& seq, int64_t committed,
                                       const TierChoice& choice) const {
  // Algorithm 1 runs in generation, one token a step; the prompt's tokens were placed by
  // ChooseTiers alone.
  if (committed != 1 || seq.length() <= 1) return absl::OkStatus();
  const int64_t length = seq.length();
  const float n = static_cast<float>(length);
  const float high = config().alpha_high / n, low = config().alpha_low / n;
  for (size_t i = 0; i < choice.size(); ++i) {
    const ListState& ls = seq.list(i);
    for (int8_t t : choice[i]) {
      if (t < 0) continue;  // the candidate itself went
      // The least significant live token of the tier the candidate joined.
      LiveToken victim{.position = -1};
      float least = 0.f;
      seq.ForEachLive(i, t, [&](const LiveToken& token) {
        const float score = Significance(ls, token.position, length);
        if (victim.position < 0 || score < least) {
          victim = token;
          least = score;
        }
      });
      // Lines 8-11 for the high tier: demoted within [low, high), evicted below low (even when
      // low > high: then there is no low tier); lines 16-17 for the low tier: evicted below low.
      if (victim.position < 0 || (least >= low && (t == 1 || least >= high))) continue;
      if (least >= low) {
        SLUICE_RETURN_IF_ERROR(seq.Demote(i, victim));
      } else {
        SLUICE_RETURN_IF_ERROR(seq.Evict(i, {victim.position}));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::kvstore::policy
