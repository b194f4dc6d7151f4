// Abseil links and runs: Status, StatusOr, StrFormat, flat_hash_map, Mutex.
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace {

absl::StatusOr<int> ParsePositive(int v) {
  if (v <= 0) return absl::InvalidArgumentError(absl::StrFormat("value %d is not positive", v));
  return v;
}

TEST(AbslSmoke, StatusAndContainers) {
  EXPECT_EQ(*ParsePositive(4), 4);
  absl::StatusOr<int> bad = ParsePositive(-2);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "value -2 is not positive");

  absl::flat_hash_map<std::string, int> m;
  absl::Mutex mu;
  {
    absl::MutexLock lock(&mu);
    m["pages"] = 16;
  }
  EXPECT_EQ(m.at("pages"), 16);
}

}  // namespace
