// Learning-rate schedules at chosen steps, worked out by hand, and validate() errors.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/optim_test_util.h"
#include "tessera/optim/schedule.h"

namespace tessera::test {
namespace {

using optim::learning_rate;
using optim::ScheduleConfig;

// peak 1e-3, 10 warm-up steps, decay over steps [10, 110) to 1e-4.
ScheduleConfig schedule(const std::string& decay) {
  return {.peak_lr = 1e-3, .decay = decay, .warmup_steps = 10, .total_steps = 110, .min_lr_ratio = 0.1};
}

TEST(OptimSchedule, CosineAtChosenSteps) {
  ScheduleConfig s = schedule("cosine");
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 1e-4) << "first warm-up step: peak * 1/10, not 0";
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 9), 1e-3) << "last warm-up step reaches the peak";
  EXPECT_DOUBLE_EQ(learning_rate(s, 10), 1e-3) << "decay starts at the peak";
  // Step 60 is half-way: 1e-4 + 9e-4 * (1 + cos(pi/2)) / 2.
  EXPECT_DOUBLE_EQ(learning_rate(s, 60), 5.5e-4);
  // Step 35 is a quarter: 1e-4 + 9e-4 * (1 + cos(pi/4)) / 2 = 1e-4 + 4.5e-4 * 1.70710678...
  EXPECT_NEAR(learning_rate(s, 35), 8.681980515339464e-4, 1e-15);
  // Step 109, the last of the decay: 1e-4 + 4.5e-4 * (1 - cos(0.01 pi)) = 1e-4 + 4.5e-4 * 4.9344e-4.
  EXPECT_NEAR(learning_rate(s, 109), 1.0022204e-4, 1e-11);
  EXPECT_DOUBLE_EQ(learning_rate(s, 110), 1e-4) << "end of the schedule: min_lr_ratio * peak";
  EXPECT_DOUBLE_EQ(learning_rate(s, 5000), 1e-4) << "constant after the end";
}

TEST(OptimSchedule, LinearAtChosenSteps) {
  ScheduleConfig s = schedule("linear");
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 10), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(s, 35), 7.75e-4);  // 1e-3 - 9e-4 / 4
  EXPECT_DOUBLE_EQ(learning_rate(s, 60), 5.5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 109), 1.09e-4);  // 1e-3 - 9e-4 * 99/100
  EXPECT_DOUBLE_EQ(learning_rate(s, 110), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 111), 1e-4);
}

TEST(OptimSchedule, ConstantKeepsThePeakAfterWarmUp) {
  ScheduleConfig s = schedule("constant");
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 5), 6e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 10), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(s, 110), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(s, 100000), 1e-3);
}

TEST(OptimSchedule, NoWarmUpStartsAtThePeak) {
  ScheduleConfig s{.peak_lr = 2e-3, .decay = "cosine", .warmup_steps = 0, .total_steps = 4, .min_lr_ratio = 0};
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 2e-3);
  EXPECT_NEAR(learning_rate(s, 2), 1e-3, 1e-18);  // cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 0);
}

TEST(OptimSchedule, ValidateNamesTheField) {
  auto bad = [](auto edit) {
    ScheduleConfig s;
    edit(s);
    return s;
  };
  EXPECT_NO_THROW(ScheduleConfig{}.validate());
  expect_error<ValueError>([&] { bad([](auto& s) { s.warmup_steps = 2000; }).validate(); },
                           {"warmup_steps", "2000", "total_steps", "1000"});
  expect_error<ValueError>([&] { bad([](auto& s) { s.peak_lr = -1e-3; }).validate(); }, {"peak_lr"});
  expect_error<ValueError>([&] { bad([](auto& s) { s.peak_lr = std::nan(""); }).validate(); }, {"peak_lr"});
  expect_error<ValueError>([&] { bad([](auto& s) { s.decay = "cosin"; }).validate(); },
                           {"decay", "cosin", "cosine, linear, constant"});
  expect_error<ValueError>([&] { bad([](auto& s) { s.warmup_steps = -1; }).validate(); }, {"warmup_steps"});
  expect_error<ValueError>([&] { bad([](auto& s) { s.min_lr_ratio = 1.5; }).validate(); }, {"min_lr_ratio"});
  // learning_rate validates, and steps are 0-based.
  expect_error<ValueError>([&] { learning_rate(bad([](auto& s) { s.decay = "step"; }), 0); }, {"decay"});
  expect_error<ValueError>([&] { learning_rate(ScheduleConfig{}, -1); }, {"step", "-1"});
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

TEST(OptimSchedule, WarmupStableDecay) {
  optim::ScheduleConfig s;
  s.peak_lr = 1.0;
  s.decay = "wsd";
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.decay_fraction = 0.2;
  s.min_lr_ratio = 0.0;
  EXPECT_DOUBLE_EQ(optim::learning_rate(s, 0), 0.1);  // warm-up
  EXPECT_DOUBLE_EQ(optim::learning_rate(s, 9), 1.0);
  EXPECT_DOUBLE_EQ(optim::learning_rate(s, 10), 1.0);     // stable from the end of warm-up ...
  EXPECT_DOUBLE_EQ(optim::learning_rate(s, 89), 1.0);     // ... to 80% of the 100 steps after it
  EXPECT_DOUBLE_EQ(optim::learning_rate(s, 90), 1.0);     // the decay starts here (t = 0.8)
  EXPECT_NEAR(optim::learning_rate(s, 100), 0.5, 1e-12);  // halfway down
  EXPECT_DOUBLE_EQ(optim::learning_rate(s, 110), 0.0);
  s.decay_fraction = 0;
  EXPECT_THROW(s.validate(), ValueError);
}

}  // namespace
}  // namespace tessera::test
