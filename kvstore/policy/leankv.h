// LeanKV: two tiers per (layer, kv-head) plus eviction. A token's significance is its
// cumulative attention per query that saw it, the largest over the kv-head's query heads;
// against alpha_high / N and alpha_low / N (N: the sequence's length) it goes to the high
// tier, the low tier, or is evicted as it leaves the full-precision window (prompt and
// generation alike). In generation, the tier a token joined then gives up its least
// significant token (Algorithm 1, lines 7-17): a high-tier one is demoted within
// [alpha_low, alpha_high) / N and evicted below, a low-tier one evicted below alpha_low / N.
#ifndef SLUICE_KVSTORE_POLICY_LEANKV_H_
#define SLUICE_KVSTORE_POLICY_LEANKV_H_

#include "kvstore/policy/token_policy.h"

namespace sluice::kvstore::policy {

class LeanKvPolicy final : public TokenPolicy {
 public:
  using TokenPolicy::TokenPolicy;
  std::string_view name() const override { return "leankv"; }
  ScoreMode scores() const override { return ScoreMode::kPerQueryHead; }
  bool two_tiers() const override { return true; }
  TierChoice ChooseTiers(SequenceView& seq, int64_t flush) const override;
  absl::Status AfterCommit(SequenceView& seq, int64_t committed,
                           const TierChoice& choice) const override;

  // The significance of `position` in a list whose state is `ls` after `length` tokens; 0 for a
  // position no query attended yet.
  float Significance(const ListState& ls, int64_t position, int64_t length) const;
};

}  // namespace sluice::kvstore::policy

#endif  // SLUICE_KVSTORE_POLICY_LEANKV_H_
