#include "common/process.h"

#include <atomic>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(IdleTrimmerTest, TrimsOnceEachTimeABusyProcessTurnsIdle) {
  std::atomic<bool> idle{true};
  IdleTrimmer trimmer([&] { return idle.load(); }, absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(trimmer.trims(), 0);  // never busy: nothing to give back
  for (int round = 1; round <= 2; ++round) {
    idle = false;
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_EQ(trimmer.trims(), round - 1);
    idle = true;
    for (int i = 0; i < 200 && trimmer.trims() < round; ++i) absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(30));  // idle on: no second trim
    EXPECT_EQ(trimmer.trims(), round);
  }
}

TEST(ServedModelNameTest, IsTheFileNameWithoutItsExtension) {
  EXPECT_EQ(ServedModelName("/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            "SmolLM2-135M-Instruct.Q4_1");
}

}  // namespace
}  // namespace sluice
