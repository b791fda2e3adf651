#include "common/deadline.h"

#include <gtest/gtest.h>

#include <chrono>

namespace pstrain {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(PollUntilTest, ReturnsAtOnceWhenDone) {
  int polls = 0;
  EXPECT_TRUE(
      PollUntil([&] { return ++polls > 0; }, Deadline::In(milliseconds(0)), microseconds(0)));
  EXPECT_EQ(polls, 1);
}

TEST(PollUntilTest, PollsUntilDone) {
  int polls = 0;
  EXPECT_TRUE(PollUntil([&] { return ++polls == 20; }, Deadline::In(std::chrono::minutes(1)),
                        microseconds(0)));
  EXPECT_EQ(polls, 20);
}

TEST(PollUntilTest, GivesUpAtTheDeadline) {
  const auto start = SteadyClock::now();
  EXPECT_FALSE(PollUntil([] { return false; }, Deadline::In(milliseconds(30)), microseconds(100)));
  const auto took = SteadyClock::now() - start;
  EXPECT_GE(took, milliseconds(30));
  EXPECT_LT(took, std::chrono::seconds(5));
}

TEST(PollUntilTest, PastTheSpinItSleepsBetweenPolls) {
  // No spin: every poll after the first sleeps at least 10, 20, 40, 80, then
  // 100 us, so 50 ms hold at most 5 + 50000 / 100 polls (more on a busy host
  // would mean it spins).
  int polls = 0;
  EXPECT_FALSE(PollUntil(
      [&] {
        ++polls;
        return false;
      },
      Deadline::In(milliseconds(50)), microseconds(0)));
  EXPECT_GE(polls, 2);
  EXPECT_LE(polls, 510);
}

}  // namespace
}  // namespace pstrain
