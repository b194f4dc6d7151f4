// StreamingLLM's attention sinks: the first `sinks` tokens and the most recent ones stay,
// budget x length in all (at least one recent token); everything between is evicted after each
// commit, as it falls out of the budget.
#ifndef SLUICE_KVSTORE_POLICY_SINKS_H_
#define SLUICE_KVSTORE_POLICY_SINKS_H_

#include "kvstore/policy/token_policy.h"

namespace sluice::kvstore::policy {

class SinksPolicy final : public TokenPolicy {
 public:
  using TokenPolicy::TokenPolicy;
  std::string_view name() const override { return "sinks"; }
  absl::Status AfterCommit(SequenceView& seq, int64_t committed,
                           const TierChoice& choice) const override;
};

}  // namespace sluice::kvstore::policy

#endif  // SLUICE_KVSTORE_POLICY_SINKS_H_
