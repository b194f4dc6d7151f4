#include "kvstore/policy/token_policy.h"

#include "absl/strings/str_format.h"
#include "kvstore/policy/h2o.h"
#include "kvstore/policy/leankv.h"
#include "kvstore/policy/minikv.h"
#include "kvstore/policy/pyramid.h"
#include "kvstore/policy/sinks.h"
#include "kvstore/policy/snapkv.h"

namespace sluice::kvstore::policy {
namespace {

// Every token stays, in the high tier: the pages a commit writes never change.
class KeepAllPolicy final : public TokenPolicy {
 public:
  using TokenPolicy::TokenPolicy;
  std::string_view name() const override { return "none"; }
  bool changes_pages() const override { return false; }
};

}  // namespace

absl::StatusOr<std::vector<std::vector<int64_t>>> TokenPolicy::SelectPrompt(
    kernels::Backend&, const PromptLayer&) const {
  return std::vector<std::vector<int64_t>>(shape_.kv_heads);
}

TierChoice TokenPolicy::ChooseTiers(SequenceView&, int64_t) const { return {}; }

absl::Status TokenPolicy::AfterCommit(SequenceView&, int64_t, const TierChoice&) const {
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TokenPolicy>> MakeTokenPolicy(const KvPolicy& config,
                                                             const PolicyShape& shape) {
  if (shape.layers <= 0 || shape.heads <= 0 || shape.kv_heads <= 0 ||
      shape.heads % shape.kv_heads != 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("token policy: bad shape layers=%d heads=%d kv_heads=%d head_dim=%d",
                        shape.layers, shape.heads, shape.kv_heads, shape.head_dim));
  }
  if (!(config.budget > 0.f && config.budget <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("token policy: budget %g outside (0, 1]", config.budget));
  }
  if (config.sinks < 0 || config.observation <= 0 || config.pool <= 0 || config.pool % 2 == 0 ||
      config.pyramid_depth <= 0 || config.alpha_high < 0 || config.alpha_low < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "token policy: sinks=%d observation=%d pool=%d (odd) pyramid_depth=%d alpha_high=%g "
        "alpha_low=%g: each must be positive (sinks, alphas: non-negative)",
        config.sinks, config.observation, config.pool, config.pyramid_depth, config.alpha_high,
        config.alpha_low));
  }
  switch (config.kind) {
    case KvPolicyKind::kNone:
      return std::make_unique<KeepAllPolicy>(config, shape);
    case KvPolicyKind::kSinks:
      return std::make_unique<SinksPolicy>(config, shape);
    case KvPolicyKind::kSnapKv:
      return std::make_unique<SnapKvPolicy>(config, shape);
    case KvPolicyKind::kPyramid:
      return std::make_unique<PyramidPolicy>(config, shape);
    case KvPolicyKind::kMiniKv:
      return std::make_unique<MiniKvPolicy>(config, shape);
    case KvPolicyKind::kH2o:
      return std::make_unique<H2oPolicy>(config, shape);
    case KvPolicyKind::kLeanKv:
      return std::make_unique<LeanKvPolicy>(config, shape);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("token policy: unknown kind %d", static_cast<int>(config.kind)));
}

}  // namespace sluice::kvstore::policy
