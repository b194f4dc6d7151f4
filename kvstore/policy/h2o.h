// H2O's heavy hitters: after every commit each (layer, kv-head) keeps budget x length tokens,
// the most recent half of them and, among the older ones, those with the largest cumulative
// attention (summed over the kv-head's query heads); ties keep the earlier token.
#ifndef SLUICE_KVSTORE_POLICY_H2O_H_
#define SLUICE_KVSTORE_POLICY_H2O_H_

#include "kvstore/policy/token_policy.h"

namespace sluice::kvstore::policy {

class H2oPolicy final : public TokenPolicy {
 public:
  using TokenPolicy::TokenPolicy;
  std::string_view name() const override { return "h2o"; }
  ScoreMode scores() const override { return ScoreMode::kSummed; }
  absl::Status AfterCommit(SequenceView& seq, int64_t committed,
                           const TierChoice& choice) const override;
};

}  // namespace sluice::kvstore::policy

#endif  // SLUICE_KVSTORE_POLICY_H2O_H_
