// The hang detector's timeouts, on an injected clock.
#include <gtest/gtest.h>

#include "launch/hang_detector.h"
#include "tessera/base/error.h"

using namespace tessera;
using namespace tessera::launch;

TEST(HangDetector, FixedTimeoutCountsFromTheLastStepChange) {
  HangDetector d(2, HangPolicy{.timeout_s = 30.0});
  d.start_attempt(100);
  d.observe(0, 1, 1000.0, 101);
  d.observe(1, 1, 1000.0, 101);
  d.observe(0, 2, 1001.0, 120);
  d.observe(1, 1, 1000.0, 125);  // same step again: no progress
  EXPECT_FALSE(d.check(131.0));
  const auto hang = d.check(131.5);
  ASSERT_TRUE(hang);
  EXPECT_EQ(*hang, "hang: no step progress for 30 s (rank 1 stuck after step 1)");
  d.finished(1);  // a rank that exited cleanly is not watched
  EXPECT_FALSE(d.check(131.5));
}

TEST(HangDetector, AutoTimeoutIsTenMediansWithASixtySecondFloor) {
  HangDetector d(1, HangPolicy{});
  d.start_attempt(0);
  EXPECT_DOUBLE_EQ(d.progress_timeout_s(), 60);
  d.observe(0, 1, 0.0, 1);
  d.observe(0, 3, 4.0, 5);    // 2 s per step
  d.observe(0, 4, 5.0, 6);    // 1 s
  d.observe(0, 5, 35.0, 36);  // 30 s (an eval)
  ASSERT_TRUE(d.median_step_s());
  EXPECT_DOUBLE_EQ(*d.median_step_s(), 2.0);
  EXPECT_DOUBLE_EQ(d.progress_timeout_s(), 60);
  d.observe(0, 6, 45.0, 46);  // 10 s
  d.observe(0, 7, 55.0, 56);  // 10 s: median 10 -> 100 s
  EXPECT_DOUBLE_EQ(d.progress_timeout_s(), 100);
  EXPECT_FALSE(d.check(155));
  EXPECT_TRUE(d.check(157));
}

TEST(HangDetector, FirstStepGetsTheStartUpAllowanceEachAttempt) {
  HangDetector d(1, HangPolicy{.timeout_s = 5.0, .startup_s = 100});
  d.start_attempt(0);
  EXPECT_FALSE(d.check(99));
  const auto hang = d.check(101);
  ASSERT_TRUE(hang);
  EXPECT_EQ(*hang, "hang: rank 0 completed no step within the start-up allowance of 100 s");
  d.observe(0, 4, 10.0, 101);
  d.start_attempt(200);  // a restart: the rank is unseen again
  EXPECT_EQ(d.last_step(0), -1);
  EXPECT_FALSE(d.check(250));
}

TEST(HangDetector, RejectsBadPolicies) {
  EXPECT_THROW(HangDetector(0, HangPolicy{}), ValueError);
  EXPECT_THROW(HangDetector(1, HangPolicy{.timeout_s = 0.0}), ValueError);
  EXPECT_THROW(HangDetector(1, HangPolicy{.timeout_s = std::nullopt, .startup_s = -1}), ValueError);
}
