// Token policies: which of a sequence's tokens a KV cache keeps, and in which tier.
//
// A policy decides; the cache (kvstore/cache/paged_kv_cache.h) carries out. The cache calls a
// policy at three points of a sequence's life and never asks which policy it runs:
//   prompt      SelectPrompt: from the attention of the whole prompt, the prompt tokens of each
//               kv-head that never reach pages (snapkv, pyramid, minikv)
//   flush       ChooseTiers: for each token leaving the full-precision window, the tier it goes
//               to or eviction (leankv)
//   commit      AfterCommit: eviction (and demotion) as the sequence grows (sinks, h2o, leankv)
// and it feeds every policy that asks (scores()) the attention each cached token receives.
//
// The cache keeps each sequence's policy state (SequenceState, one ListState per
// (layer, kv-head) list), copies it with a fork and ships it with an exported sequence, so a
// policy object itself holds only its settings and serves every sequence.
//
// One file per policy: sinks.h, snapkv.h (pyramid.h and minikv.h select the same way with
// other budgets and scorers), h2o.h, leankv.h. MakeTokenPolicy builds the one a preset names.
#ifndef SLUICE_KVSTORE_POLICY_TOKEN_POLICY_H_
#define SLUICE_KVSTORE_POLICY_TOKEN_POLICY_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kvstore/kv_preset.h"

namespace sluice::kvstore::policy {

// The model's attention shape, as a policy needs it.
struct PolicyShape {
  int32_t layers = 0;
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // divides heads
  int64_t head_dim = 0;
  float scale = 0.f;  // attention scale
  int64_t group() const { return heads / kv_heads; }
};

// The attention a policy wants to hear of: none, each key's summed over its kv-head's query
// heads ([position]), or each query head's apart ([position][heads / kv_heads]).
enum class ScoreMode { kNone, kSummed, kPerQueryHead };

// Policy state of one (layer, kv-head) list of one sequence.
struct ListState {
  std::vector<float> score;   // cumulative attention by position (ScoreMode's layout)
  std::vector<uint8_t> gone;  // positions the policy evicted (h2o)
};

// Policy state of one sequence.
struct SequenceState {
  int64_t evicted_to = -1;  // sinks: every position in [sinks, evicted_to) is evicted
};

// Where a tier of the flushed tokens of each list goes, [lists][flushed token]: 0 high, 1 low,
// -1 evicted. Empty: every token to the high tier.
using TierChoice = std::vector<std::vector<int8_t>>;

// A live paged token: its position and where it sits in its tier's pages.
struct LiveToken {
  int64_t position = 0;
  int32_t page = 0;  // index in the tier's page list
  int32_t slot = 0;
};

// The cache's side of one sequence, as a policy sees and changes it. Lists are numbered
// layer * kv_heads + kv_head.
class SequenceView {
 public:
  virtual ~SequenceView() = default;
  virtual int64_t length() const = 0;      // committed tokens
  virtual int64_t compressed() const = 0;  // the first compressed() tokens are in pages
  virtual SequenceState& state() = 0;
  virtual ListState& list(int64_t i) = 0;
  virtual int64_t lists() const = 0;
  // Calls fn for each live token of tier `tier` of list i, in slot order.
  virtual void ForEachLive(int64_t i, int tier,
                           absl::FunctionRef<void(const LiveToken&)> fn) const = 0;
  // Evicts committed `positions` of list i: paged ones at once, window ones when they would
  // move to pages.
  virtual absl::Status Evict(int64_t i, absl::Span<const int64_t> positions) = 0;
  // Moves a live high-tier token of list i to the low tier (re-quantized there).
  virtual absl::Status Demote(int64_t i, const LiveToken& token) = 0;
};

// The prompt of one layer, all its tokens at once (row t of k and v holds token t's kv-heads,
// [n, kv_heads, head_dim]; q is [n, heads, head_dim]).
struct PromptLayer {
  int layer = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t n = 0;
};

class TokenPolicy {
 public:
  explicit TokenPolicy(const KvPolicy& config, const PolicyShape& shape)
      : config_(config), shape_(shape) {}
  virtual ~TokenPolicy() = default;

  virtual std::string_view name() const = 0;
  virtual ScoreMode scores() const { return ScoreMode::kNone; }
  // Whether SelectPrompt needs a whole prompt's attention in one pass (no chunked prefill).
  virtual bool selects_prompt() const { return false; }
  // Whether the policy places tokens in a low tier (the preset must have one).
  virtual bool two_tiers() const { return false; }
  // Whether pages may change after the commit that wrote them (eviction, demotion).
  virtual bool changes_pages() const { return true; }

  // The prompt positions of each kv-head of `prompt.layer` to drop, [kv_heads][positions]
  // (any order). Called once per layer when a sequence's first pass holds its whole prompt.
  virtual absl::StatusOr<std::vector<std::vector<int64_t>>> SelectPrompt(
      kernels::Backend& backend, const PromptLayer& prompt) const;
  // Where each of the `flush` tokens after seq.compressed() goes as it leaves the window.
  virtual TierChoice ChooseTiers(SequenceView& seq, int64_t flush) const;
  // After a commit of `committed` tokens whose flush placed tokens by `choice`.
  virtual absl::Status AfterCommit(SequenceView& seq, int64_t committed,
                                   const TierChoice& choice) const;

  const KvPolicy& config() const { return config_; }
  const PolicyShape& shape() const { return shape_; }

 private:
  const KvPolicy config_;
  const PolicyShape shape_;
};

// The policy `config` names. InvalidArgument for a shape that does not fit or a setting out of
// range (a budget outside (0, 1], an even pooling width).
absl::StatusOr<std::unique_ptr<TokenPolicy>> MakeTokenPolicy(const KvPolicy& config,
                                                             const PolicyShape& shape);

}  // namespace sluice::kvstore::policy

#endif  // SLUICE_KVSTORE_POLICY_TOKEN_POLICY_H_
