// The checkpoint policy's pure part: the Young/Daly interval sqrt(2 C M) against
// hand-computed values. TESSERA_FAULT's tests are in test_fault_injection.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "tessera/base/error.h"
#include "train/checkpoint_interval.h"

namespace tessera::train {
namespace {

TEST(YoungDaly, IntervalIsSqrtOfTwiceCostTimesMtbf) {
  // C = 10 s, M = 3600 s: sqrt(72000) = 268.328... s.
  EXPECT_NEAR(young_daly_interval_s(10, 3600), 268.32815729997475, 1e-9);
  EXPECT_NEAR(young_daly_interval_s(0.5, 86400), 293.93876913398137, 1e-9);
  EXPECT_EQ(young_daly_interval_s(0, 3600), 0.0);
  // In steps of 2 s: 268.33 / 2 = 134.16 -> 134; a cost so small the interval is below
  // one step still saves every step, never every 0.
  EXPECT_EQ(young_daly_interval_steps(10, 3600, 2.0), 134);
  EXPECT_EQ(young_daly_interval_steps(1e-6, 1, 10.0), 1);
  // Four times the cost doubles the interval.
  EXPECT_EQ(young_daly_interval_steps(40, 3600, 2.0), 268);
}

TEST(YoungDaly, BadInputsAreErrors) {
  EXPECT_THROW(young_daly_interval_s(-1, 3600), ValueError);
  EXPECT_THROW(young_daly_interval_s(1, 0), ValueError);
  EXPECT_THROW(young_daly_interval_s(NAN, 3600), ValueError);
  EXPECT_THROW(young_daly_interval_steps(1, 3600, 0), ValueError);
}

TEST(LocalTierInterval, SavesAsOftenAsTheBudgetAllowsButNotFasterThanAWrite) {
  // 0.05 s per save, 0.5 s steps, 1%: every 0.05 / 0.005 = 10 steps.
  EXPECT_EQ(budget_interval_steps(0.05, 0.1, 0.5, 0.01), 10);
  EXPECT_EQ(budget_interval_steps(0.051, 0.1, 0.5, 0.01), 11);  // rounded up: never over the budget
  // A write that takes 14.4 steps' time: no save before it finished.
  EXPECT_EQ(budget_interval_steps(0.05, 7.2, 0.5, 0.01), 15);
  EXPECT_EQ(budget_interval_steps(0, 0, 0.5, 0.01), 1);  // free: every step
  EXPECT_THROW(budget_interval_steps(-1, 0, 0.5, 0.01), ValueError);
  EXPECT_THROW(budget_interval_steps(0.05, NAN, 0.5, 0.01), ValueError);
  EXPECT_THROW(budget_interval_steps(0.05, 0, 0, 0.01), ValueError);
  EXPECT_THROW(budget_interval_steps(0.05, 0, 0.5, 0), ValueError);
}

}  // namespace
}  // namespace tessera::train
