// SnapKV: at the end of the prompt, the attention of its last `observation` tokens (the
// observation window), summed over each kv-head's query heads and max-pooled over `pool`
// neighbouring keys, picks the budget x prompt tokens that stay, the window among them;
// generated tokens all stay. PyramidKV (pyramid.h) and MiniKV (minikv.h) select the same way
// with other budgets and scorers, through the two hooks below.
#ifndef SLUICE_KVSTORE_POLICY_SNAPKV_H_
#define SLUICE_KVSTORE_POLICY_SNAPKV_H_

#include "kvstore/policy/token_policy.h"

namespace sluice::kvstore::policy {

class SnapKvPolicy : public TokenPolicy {
 public:
  using TokenPolicy::TokenPolicy;
  std::string_view name() const override { return "snapkv"; }
  bool selects_prompt() const override { return true; }
  absl::StatusOr<std::vector<std::vector<int64_t>>> SelectPrompt(
      kernels::Backend& backend, const PromptLayer& prompt) const final;

 protected:
  // The fraction of the prompt layer `layer` keeps.
  virtual float Budget(int layer) const { return config().budget; }
  // Whether every prompt query scores the keys, each key's attention divided by the queries
  // that saw it (MiniKV), instead of the observation window's alone.
  virtual bool WholePromptScores() const { return false; }
};

}  // namespace sluice::kvstore::policy

#endif  // SLUICE_KVSTORE_POLICY_SNAPKV_H_
