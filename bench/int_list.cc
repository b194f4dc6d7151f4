#include "bench/int_list.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace sluice::bench {

absl::StatusOr<std::vector<int>> ParseIntList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError("bad list entry '" + std::string(part) + "'");
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace sluice::bench
