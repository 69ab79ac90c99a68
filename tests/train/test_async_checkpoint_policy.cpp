// The checkpoint policy's pure parts: the Young/Daly interval sqrt(2 C M) against
// hand-computed values, and TESSERA_FAULT specs with the "fires only in an attempt
// that started before its step" rule.
#include <gtest/gtest.h>

#include <cmath>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "train/checkpoint_interval.h"
#include "train/fault_injection.h"

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

TEST(FaultPlan, ParsesEveryFaultAndTheRankFilter) {
  FaultPlan kill = FaultPlan::parse("kill@step=7");
  EXPECT_EQ(kill.kind, FaultPlan::Kind::kKill);
  EXPECT_EQ(kill.step, 7);
  EXPECT_EQ(kill.rank, -1);
  FaultPlan hang = FaultPlan::parse("hang@step=5,rank=1");
  EXPECT_EQ(hang.kind, FaultPlan::Kind::kHang);
  EXPECT_EQ(hang.rank, 1);
  EXPECT_EQ(FaultPlan::parse("corrupt_newest").kind, FaultPlan::Kind::kCorruptNewest);
  EXPECT_EQ(FaultPlan::parse("fail_write@step=4").kind, FaultPlan::Kind::kFailWrite);
  EXPECT_EQ(FaultPlan::parse("").kind, FaultPlan::Kind::kNone);
}

TEST(FaultPlan, BadSpecsNameThePart) {
  for (const char* bad : {"explode@step=3", "kill@step=x", "kill@step=-1", "kill", "kill@step=1,hang@step=2", "rank=1",
                          "kill@step=2,rank=one"}) {
    try {
      FaultPlan::parse(bad);
      ADD_FAILURE() << bad << ": no error";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(FaultInjector, FiresOnceInAnAttemptThatStartedBeforeTheStepAndOnTheRightRank) {
  tessera::testing::TempDir dir;
  const FaultPlan fail_write = FaultPlan::parse("fail_write@step=4");
  // Resumed at (or past) the step: the fault is off.
  EXPECT_FALSE(FaultInjector(fail_write, 0, 4, dir.path()).active());
  EXPECT_TRUE(FaultInjector(fail_write, 0, 3, dir.path()).active());
  FaultInjector fresh(fail_write, 0, /*start_step=*/0, dir.path());
  EXPECT_FALSE(fresh.fail_this_write(2));
  EXPECT_TRUE(fresh.fail_this_write(4));
  EXPECT_FALSE(fresh.fail_this_write(6)) << "one write fails";
  EXPECT_TRUE(std::filesystem::exists(dir / ".fault_fired.fail_write.rank0"));
  // A restarted job (another attempt, same spec) makes progress: the marker keeps it off.
  EXPECT_FALSE(FaultInjector(fail_write, 0, 0, dir.path()).active());
  EXPECT_TRUE(FaultInjector(fail_write, 1, 0, dir.path()).active()) << "markers are per rank";
  const FaultPlan on_rank_1 = FaultPlan::parse("kill@step=3,rank=1");
  EXPECT_FALSE(FaultInjector(on_rank_1, 0, 0, dir.path()).active());
  EXPECT_TRUE(FaultInjector(on_rank_1, 1, 0, dir.path()).active());
  // An inactive kill at its step does nothing (this process survives the call).
  FaultInjector(on_rank_1, 0, 0, dir.path()).at_step_start(3);
}

TEST(FaultInjector, CorruptNewestFlipsTheNewestParamsOncePerRunDirectory) {
  tessera::testing::TempDir dir;
  for (const char* step : {"step_00000002", "step_00000004"})
    tessera::testing::write_bytes(dir / "checkpoints" / step / "params.safetensors", std::string(64, 'a'));
  FaultInjector injector(FaultPlan::parse("corrupt_newest"), 0, 0, dir.path());
  const std::filesystem::path file = injector.corrupt_newest({dir / "checkpoints"});
  EXPECT_EQ(file, dir / "checkpoints/step_00000004/params.safetensors");
  const std::string bytes = tessera::testing::read_bytes(file);
  EXPECT_EQ(bytes.substr(0, 32), std::string(32, 'a'));
  EXPECT_EQ(bytes.substr(32, 16), std::string(16, 'a' ^ 0x5a));
  EXPECT_EQ(tessera::testing::read_bytes(dir / "checkpoints/step_00000002/params.safetensors"), std::string(64, 'a'));
  EXPECT_TRUE(injector.corrupt_newest({dir / "checkpoints"}).empty()) << "once";
  FaultInjector restarted(FaultPlan::parse("corrupt_newest"), 0, 0, dir.path());
  EXPECT_TRUE(restarted.corrupt_newest({dir / "checkpoints"}).empty()) << "once per run directory";
}

}  // namespace
}  // namespace tessera::train
