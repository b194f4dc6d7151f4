// PyramidKV: SnapKV's selection with a budget per layer, linear in depth from
// budget x (2 - 1/δ) at the bottom layer to budget / δ at the top (PyramidBudget, kv_preset.h),
// so that the layers keep `budget` of the prompt on average.
#ifndef SLUICE_KVSTORE_POLICY_PYRAMID_H_
#define SLUICE_KVSTORE_POLICY_PYRAMID_H_

#include "kvstore/policy/snapkv.h"

namespace sluice::kvstore::policy {

class PyramidPolicy final : public SnapKvPolicy {
 public:
  using SnapKvPolicy::SnapKvPolicy;
  std::string_view name() const override { return "pyramid"; }

 protected:
  float Budget(int layer) const override { return PyramidBudget(config(), layer, shape().layers); }
};

}  // namespace sluice::kvstore::policy

#endif  // SLUICE_KVSTORE_POLICY_PYRAMID_H_
