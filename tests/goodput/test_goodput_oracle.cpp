// tessera's goodput figures against Google's ml-goodput-measurement on the same runs:
// tests/oracles/goodput_oracle.py translated the committed fixture logs into its
// entries and stored its goodput and badput breakdown (% of total) in the golden.
// Categories both define are compared one to one; those split differently by design
// are compared as the sums docs/goodput.md describes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/goodput/calculator.h"
#include "tessera/goodput/events.h"

namespace tessera::goodput {
namespace {

namespace fs = std::filesystem;
constexpr double kTolerancePp = 0.5;

nlohmann::json golden() {
  std::ifstream in(fs::path(TESSERA_SOURCE_DIR) / "tests/oracles/goldens/goodput_oracle.json");
  EXPECT_TRUE(in) << "missing golden: run tests/oracles/run_oracle.sh goodput_oracle";
  return nlohmann::json::parse(in);
}

double pct(const GoodputReport& r, Category c) { return 100 * r.fraction_of(c); }

void compare(const std::string& name) {
  const nlohmann::json g = golden().at("cases").at(name);
  const GoodputReport r =
      compute_goodput(read_event_log(fs::path(TESSERA_SOURCE_DIR) / "tests/goodput/fixtures" / (name + ".jsonl")));
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
  const nlohmann::json& b = g.at("badput_percent");
  auto ref = [&](const char* key) { return b.value(key, 0.0); };
  SCOPED_TRACE(name);
  EXPECT_NEAR(100 * r.goodput, g.at("goodput_percent").get<double>(), kTolerancePp);
  EXPECT_NEAR(pct(r, Category::kInit), ref("TPU_INITIALIZATION"), kTolerancePp);
  EXPECT_NEAR(pct(r, Category::kCompile), ref("TRAINING_PREP"), kTolerancePp);
  EXPECT_NEAR(pct(r, Category::kCheckpointSave), ref("UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"), kTolerancePp);
  EXPECT_NEAR(pct(r, Category::kCheckpointRestore), ref("UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"), kTolerancePp);
  EXPECT_NEAR(pct(r, Category::kProgramStartup), ref("PROGRAM_STARTUP"), kTolerancePp);
  EXPECT_NEAR(pct(r, Category::kEval), ref("CUSTOM_BADPUT_EVENTS:EVAL"), kTolerancePp);
  // The reference counts only the first data load after each (re)start as badput; tessera
  // counts every synchronous wait (in-loop waits are ~0.1-0.2% here).
  EXPECT_NEAR(pct(r, Category::kDataLoading), ref("DATA_LOADING_SYNC"), kTolerancePp);
  // Disruption time is split differently (the reference has only step starts: the step cut
  // off by the failure is "recovery" there, "wasted" here; unrecorded start-up time is
  // "other" there, "recovery" here); the sum is the same time.
  const double disruption =
      pct(r, Category::kWastedProgress) + pct(r, Category::kInfrastructureRecovery) + pct(r, Category::kOther);
  EXPECT_NEAR(disruption,
              ref("WASTED_PROGRESS_FROM_DISRUPTION") + ref("INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION") + ref("OTHER"),
              kTolerancePp);
  EXPECT_EQ(r.attempts.back().last_step, g.at("max_productive_step").get<int64_t>());
}

TEST(GoodputOracle, CleanRunAgreesWithMlGoodputMeasurement) { compare("clean_run"); }

TEST(GoodputOracle, RunWithRestartsAgreesWithMlGoodputMeasurement) {
  compare("restarts_run");
  const GoodputReport r =
      compute_goodput(read_event_log(fs::path(TESSERA_SOURCE_DIR) / "tests/goodput/fixtures/restarts_run.jsonl"));
  EXPECT_EQ(r.disruptions, 2);
  // Preempted at 130 (checkpoint 99 committed) and at 190 (checkpoint 149 committed):
  // steps 100..130 and 150..190 ran twice; their first runs are wasted, once.
  EXPECT_EQ(r.wasted_steps, 31 + 41);
  EXPECT_EQ(r.kept_steps, 240);
}

}  // namespace
}  // namespace tessera::goodput
