#include "kvstore/policy/snapkv.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace sluice::kvstore::policy {

absl::StatusOr<std::vector<std::vector<int64_t>>> SnapKvPolicy::SelectPrompt(
    kernels::Backend& backend, const PromptLayer& prompt) const {
  const PolicyShape& sh = shape();
  const int64_t n = prompt.n, d = sh.head_dim, heads = sh.heads, group = sh.group();
  std::vector<std::vector<int64_t>> evicted(sh.kv_heads);
  const bool whole = WholePromptScores();
  const int64_t window = std::min<int64_t>(config().observation, n);
  const int64_t scorers = whole ? n : window;
  const int64_t keep = static_cast<int64_t>(std::ceil(Budget(prompt.layer) * n));
  if (keep >= n) return evicted;
  // Attention of the scoring queries over the whole prompt, summed per key.
  std::vector<float> scores(heads * n, 0.f), out(scorers * heads * d);
  SLUICE_RETURN_IF_ERROR(backend.Attention({.q = prompt.q + (n - scorers) * heads * d,
                                            .k = prompt.k,
                                            .v = prompt.v,
                                            .out = out.data(),
                                            .q_tokens = scorers,
                                            .kv_tokens = n,
                                            .q_start = n - scorers,
                                            .heads = heads,
                                            .kv_heads = sh.kv_heads,
                                            .head_dim = d,
                                            .scale = sh.scale,
                                            .key_scores = scores.data()}));
  const int64_t candidates = n - window;  // the window itself always stays
  const int64_t pick = std::max<int64_t>(0, keep - window);
  const int64_t radius = config().pool / 2;
  std::vector<float> summed(candidates), pooled(candidates);
  std::vector<int64_t> order(candidates);
  for (int64_t h = 0; h < sh.kv_heads; ++h) {
    for (int64_t j = 0; j < candidates; ++j) {
      float a = 0;
      for (int64_t g = 0; g < group; ++g) a += scores[(h * group + g) * n + j];
      summed[j] = whole ? a / static_cast<float>(n - j) : a;
    }
    for (int64_t j = 0; j < candidates; ++j) {
      float m = summed[j];
      for (int64_t o = std::max<int64_t>(0, j - radius);
           o <= std::min<int64_t>(candidates - 1, j + radius); ++o) {
        m = std::max(m, summed[o]);
      }
      pooled[j] = m;
    }
    for (int64_t j = 0; j < candidates; ++j) order[j] = j;
    // Highest pooled score first; ties keep the earlier token.
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return pooled[a] > pooled[b]; });
    evicted[h].assign(order.begin() + std::min(pick, candidates), order.end());
  }
  return evicted;
}

}  // namespace sluice::kvstore::policy
