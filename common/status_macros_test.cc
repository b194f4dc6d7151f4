#include "common/status_macros.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace sluice {
namespace {

absl::Status FailIfNegative(int v) {
  if (v < 0) return absl::OutOfRangeError("negative");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int v) {
  SLUICE_RETURN_IF_ERROR(FailIfNegative(v));
  return std::make_unique<int>(v);
}

absl::StatusOr<int> Twice(int v) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(v));
  SLUICE_ASSIGN_OR_RETURN(auto again, MakeBox(*box + 1));
  return *box + *again - 1;
}

TEST(StatusMacros, PropagatesErrorsAndMovesValues) {
  EXPECT_EQ(*Twice(5), 10);
  absl::StatusOr<int> bad = Twice(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(bad.status().message(), "negative");
}

}  // namespace
}  // namespace sluice
