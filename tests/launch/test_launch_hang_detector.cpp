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

TEST(HangDetector, AutoTimeoutIsFiveMediansWithAThreeSecondFloor) {
  HangDetector d(1, HangPolicy{});
  d.start_attempt(0);
  EXPECT_DOUBLE_EQ(d.progress_timeout_s(), 60);  // no step time known yet
  d.observe(0, 1, 0.0, 1);
  d.observe(0, 3, 0.4, 1.4);  // 0.2 s per step
  d.observe(0, 4, 0.6, 1.6);  // 0.2 s
  ASSERT_TRUE(d.median_step_s());
  EXPECT_DOUBLE_EQ(*d.median_step_s(), 0.2);
  EXPECT_DOUBLE_EQ(d.progress_timeout_s(), 3);  // the floor: 5 x 0.2 s is less
  EXPECT_FALSE(d.check(4.5));
  const auto hang = d.check(4.7);
  ASSERT_TRUE(hang);
  EXPECT_EQ(*hang, "hang: no step progress for 3 s (rank 0 stuck after step 4)");
  d.observe(0, 5, 10.6, 11);  // 10 s
  d.observe(0, 6, 20.6, 21);  // 10 s: median 10 -> 50 s
  EXPECT_DOUBLE_EQ(d.progress_timeout_s(), 50);
  EXPECT_FALSE(d.check(70));
  EXPECT_TRUE(d.check(72));
}

// Step times come only from two consecutive step-phase beats: an evaluation between
// two steps is not a slow step.
TEST(HangDetector, AnEvalBetweenStepsIsNoStepTime) {
  HangDetector d(1, HangPolicy{});
  d.start_attempt(0);
  d.observe(0, 1, 0.0, 1);
  d.observe(0, 2, 0.5, 1.5);
  d.observe(0, Progress{2, "eval", 0.6, 40.0}, 1.6);
  d.observe(0, 3, 40.6, 41.6);  // 40 s after the last step beat, with the eval between
  d.observe(0, 4, 41.1, 42.1);
  ASSERT_TRUE(d.median_step_s());
  EXPECT_DOUBLE_EQ(*d.median_step_s(), 0.5);
}

// The limit follows the phase: a long evaluation with its expected length is not a
// hang; a stuck step is, within max(3 s, 5 medians); a save without an estimate gets
// the start-up allowance.
TEST(HangDetector, LimitsFollowThePhase) {
  HangDetector d(1, HangPolicy{.timeout_s = std::nullopt, .startup_s = 100});
  d.start_attempt(0);
  d.observe(0, Progress{0, "startup", 0, std::nullopt}, 0);
  d.observe(0, Progress{0, "compile", 5, std::nullopt}, 5);
  EXPECT_FALSE(d.check(104));  // compile: 100 s from entering it
  EXPECT_TRUE(d.check(106));
  EXPECT_FALSE(d.made_progress());
  for (int s = 1; s <= 10; ++s) d.observe(0, s, 10.0 + 0.5 * s, 110 + 0.5 * s);  // 0.5 s steps, last at 115
  EXPECT_TRUE(d.made_progress());
  EXPECT_DOUBLE_EQ(d.progress_timeout_s(), 3);
  d.observe(0, Progress{10, "eval", 16, 30.0}, 116);  // expects 30 s: limit max(60, 150) = 150 s
  EXPECT_FALSE(d.check(116 + 149));
  const auto eval_hang = d.check(116 + 151);
  ASSERT_TRUE(eval_hang);
  EXPECT_EQ(*eval_hang, "hang: rank 0 spent over 150 s in eval (after step 10)");
  d.observe(0, 11, 200, 300);  // the eval ended, a step done
  EXPECT_FALSE(d.check(302.9));
  EXPECT_TRUE(d.check(303.1));  // a stuck step: 3 s
  EXPECT_EQ(d.hung_rank(303.1), 0);
  d.observe(0, Progress{11, "save", 204, std::nullopt}, 304);  // no estimate: the start-up allowance
  d.observe(0, Progress{11, "save", 250, std::nullopt}, 350);  // the same place again is no progress
  EXPECT_FALSE(d.check(403));
  EXPECT_TRUE(d.check(405));
  d.start_attempt(500);
  EXPECT_FALSE(d.made_progress());  // a new attempt has made none yet
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
  EXPECT_THROW(HangDetector(1, HangPolicy{.timeout_s = std::nullopt, .startup_s = 600, .auto_floor_s = 0}), ValueError);
}
