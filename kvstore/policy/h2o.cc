#include "kvstore/policy/h2o.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace sluice::kvstore::policy {

absl::Status H2oPolicy::AfterCommit(SequenceView& seq, int64_t, const TierChoice&) const {
  const int64_t length = seq.length();
  const int64_t keep =
      std::max<int64_t>(2, static_cast<int64_t>(std::ceil(config().budget * length)));
  const int64_t recent = keep / 2, heavy = keep - recent;
  const int64_t older = length - recent;  // candidates: positions before this
  if (older <= heavy) return absl::OkStatus();
  std::vector<int64_t> candidates;
  for (int64_t i = 0; i < seq.lists(); ++i) {
    ListState& ls = seq.list(i);
    ls.score.resize(length, 0.f);
    ls.gone.resize(length, 0);
    candidates.clear();
    for (int64_t p = 0; p < older; ++p) {
      if (!ls.gone[p]) candidates.push_back(p);
    }
    if (static_cast<int64_t>(candidates.size()) <= heavy) continue;
    // Heaviest first; the rest go.
    std::nth_element(candidates.begin(), candidates.begin() + heavy, candidates.end(),
                     [&](int64_t a, int64_t b) {
                       return ls.score[a] != ls.score[b] ? ls.score[a] > ls.score[b] : a < b;
                     });
    std::vector<int64_t> evict(candidates.begin() + heavy, candidates.end());
    for (int64_t p : evict) ls.gone[p] = 1;
    SLUICE_RETURN_IF_ERROR(seq.Evict(i, evict));
  }
  return absl::OkStatus();
}

}  // namespace sluice::kvstore::policy
