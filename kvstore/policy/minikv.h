// MiniKV's persistent heavy hitters: pyramid budgets of the prompt, scored by the attention of
// all the prompt's queries, each key's divided by the queries that saw it (H2O's cumulative
// score without its bias towards early tokens), plus the last `observation` prompt tokens;
// generated tokens all stay. The preset then quantizes what stays to 2-bit KIVI pages.
#ifndef SLUICE_KVSTORE_POLICY_MINIKV_H_
#define SLUICE_KVSTORE_POLICY_MINIKV_H_

#include "kvstore/policy/snapkv.h"

namespace sluice::kvstore::policy {

class MiniKvPolicy final : public SnapKvPolicy {
 public:
  using SnapKvPolicy::SnapKvPolicy;
  std::string_view name() const override { return "minikv"; }

 protected:
  float Budget(int layer) const override { return PyramidBudget(config(), layer, shape().layers); }
  bool WholePromptScores() const override { return true; }
};

}  // namespace sluice::kvstore::policy

#endif  // SLUICE_KVSTORE_POLICY_MINIKV_H_
