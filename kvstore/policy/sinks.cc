#include "kvstore/policy/sinks.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace sluice::kvstore::policy {

absl::Status SinksPolicy::AfterCommit(SequenceView& seq, int64_t, const TierChoice&) const {
  const KvPolicy& p = config();
  const int64_t length = seq.length();
  const int64_t keep =
      std::max<int64_t>(p.sinks + 1, static_cast<int64_t>(std::ceil(p.budget * length)));
  const int64_t recent_from = length - (keep - p.sinks);
  SequenceState& st = seq.state();
  if (st.evicted_to < 0) st.evicted_to = p.sinks;
  if (recent_from <= st.evicted_to) return absl::OkStatus();
  std::vector<int64_t> positions;
  for (int64_t pos = st.evicted_to; pos < recent_from; ++pos) positions.push_back(pos);
  st.evicted_to = recent_from;
  for (int64_t i = 0; i < seq.lists(); ++i) SLUICE_RETURN_IF_ERROR(seq.Evict(i, positions));
  return absl::OkStatus();
}

}  // namespace sluice::kvstore::policy
