// The calculator on synthetic event logs whose answers are worked out by hand here.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

#include "goodput/log_builder.h"
#include "tessera/base/error.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/events.h"
#include "tessera/goodput/report.h"

namespace tessera::goodput {
namespace {

using testing::LogBuilder;
constexpr double kTol = 1e-9;

double sum_of_categories(const GoodputReport& r) { return std::accumulate(r.seconds.begin(), r.seconds.end(), 0.0); }

bool has_warning(const GoodputReport& r, const std::string& needle) {
  return std::any_of(r.warnings.begin(), r.warnings.end(),
                     [&](const std::string& w) { return w.find(needle) != std::string::npos; });
}

GoodputReport compute(const std::string& text) { return compute_goodput(parse_event_log(text, "test.jsonl")); }

// init 0-2, compile 2-5, data wait 5-6, step 0 6-9 (3 s), steps 1..9 1 s each (9-18),
// eval 18-20, job_end 21; 2 devices of 1 GFLOP/s, 1 GFLOP and 100 tokens per step.
LogBuilder clean_run(bool with_end = true) {
  LogBuilder b;
  b.event(0, "job_start", {{"job", "clean"}});
  b.attempt(0, 0);
  b.event(0, "device", {{"name", "fake"}, {"count", 2}, {"peak_flops_per_device", 1e9}, {"source", "test"}});
  b.phase(0, 2, "backend_init").phase(2, 5, "compile").phase(5, 6, "data_wait");
  b.step(0, 6, 9);
  for (int s = 1; s <= 9; ++s) b.step(s, 8 + s, 9 + s);
  b.phase(18, 20, "eval");
  if (with_end) b.event(21, "job_end", {{"status", "ok"}});
  return b;
}

void expect_clean_figures(const GoodputReport& r) {
  EXPECT_NEAR(r.total_s, 21, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kInit), 2, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kCompile), 3, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kDataLoading), 1, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kEval), 2, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kOther), 1, kTol);  // 20-21: shutdown
  // Step 0 takes 3 s against a median of 1 s: 2 s of program start-up.
  EXPECT_NEAR(r.seconds_of(Category::kProgramStartup), 2, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kProductive), 10, kTol);
  EXPECT_NEAR(r.goodput, 10.0 / 21.0, kTol);
  EXPECT_NEAR(sum_of_categories(r), r.total_s, kTol);
}

TEST(GoodputCalculator, CleanRun) {
  const GoodputReport r = compute(clean_run().text());
  expect_clean_figures(r);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.job, "clean");
  EXPECT_EQ(r.kept_steps, 10);
  EXPECT_EQ(r.wasted_steps, 0);
  EXPECT_EQ(r.disruptions, 0);
  EXPECT_EQ(r.tokens, 1000);
  EXPECT_NEAR(r.tokens_per_s, 100, kTol);
  EXPECT_NEAR(r.effective_tokens_per_s, 1000.0 / 21, kTol);
  // 10 GFLOP in 10 productive s against 2 x 1 GFLOP/s.
  ASSERT_TRUE(r.program_goodput.has_value());
  EXPECT_NEAR(*r.program_goodput, 0.5, kTol);
  EXPECT_NEAR(r.scheduling_goodput, 1.0, kTol);
  EXPECT_FALSE(r.has_scheduling_records);
  ASSERT_TRUE(r.ml_productivity_goodput.has_value());
  EXPECT_NEAR(*r.ml_productivity_goodput, 0.5 * 10.0 / 21.0, kTol);
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
  EXPECT_NEAR(r.step_stats.median_s, 1, kTol);
  EXPECT_EQ(r.step_stats.count, 10);
  EXPECT_TRUE(r.step_stats.anomalous.empty());  // the first step of an attempt is start-up, not an anomaly
}

// Attempt 0: init 0-1, steps 0..4 (1-6), blocking save of step 4 (6-6.5, committed),
//   steps 5..7 (6.5-9.5), step 8 starts 9.5, failure at 10.
// Attempt 1 at 15: init 15-16, restore 16-17, steps 5..9 (17-22), failure at 22.5 (no save).
// Attempt 2 at 30: restore 30-31, steps 5..11 (31-38), save of step 11 (38-38.5), end 39.
LogBuilder two_failures() {
  LogBuilder b;
  b.event(0, "job_start").attempt(0, 0).phase(0, 1, "backend_init");
  for (int s = 0; s <= 4; ++s) b.step(s, 1 + s, 2 + s);
  b.save(4, 6, 6.5, "blocking", true);
  for (int s = 5; s <= 7; ++s) b.step(s, 1.5 + s, 2.5 + s);
  b.event(9.5, "step_start", {{"step", 8}});
  b.event(10, "failure", {{"signal", 9}, {"exit_code", 137}, {"message", "node lost"}});
  b.attempt(15, 1, "node lost").phase(15, 16, "backend_init").phase(16, 17, "checkpoint_restore", {{"step", 4}});
  for (int s = 5; s <= 9; ++s) b.step(s, 12 + s, 13 + s);
  b.event(22.5, "failure", {{"signal", 11}, {"exit_code", 139}, {"message", "segfault"}});
  b.attempt(30, 2, "segfault").phase(30, 31, "checkpoint_restore", {{"step", 4}});
  for (int s = 5; s <= 11; ++s) b.step(s, 26 + s, 27 + s);
  b.save(11, 38, 38.5, "blocking", true);
  b.event(39, "job_end", {{"status", "ok"}});
  return b;
}

TEST(GoodputCalculator, TwoFailuresAndRestarts) {
  const GoodputReport r = compute(two_failures().text());
  EXPECT_NEAR(r.total_s, 39, kTol);
  // Kept: steps 0..4 of attempt 0 and 5..11 of attempt 2.
  EXPECT_NEAR(r.seconds_of(Category::kProductive), 12, kTol);
  EXPECT_EQ(r.kept_steps, 12);
  // Wasted once: attempt 0 steps 5..7 (3 s) + step 8 cut off (0.5 s); attempt 1 steps 5..9 (5 s).
  EXPECT_NEAR(r.seconds_of(Category::kWastedProgress), 8.5, kTol);
  EXPECT_EQ(r.wasted_steps, 9);
  // Recovery: 10-17 less init and restore (5 s), 22-31 less restore (8 s).
  EXPECT_NEAR(r.seconds_of(Category::kInfrastructureRecovery), 13, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kInit), 2, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kCheckpointRestore), 2, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kCheckpointSave), 1, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kOther), 0.5, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kProgramStartup), 0, kTol);
  EXPECT_NEAR(sum_of_categories(r), r.total_s, kTol);
  EXPECT_NEAR(r.goodput, 12.0 / 39.0, kTol);
  EXPECT_EQ(r.disruptions, 2);
  ASSERT_EQ(r.attempts.size(), 3u);
  EXPECT_EQ(r.attempts[1].reason, "node lost");
  EXPECT_EQ(r.attempts[0].failure, "node lost");
  EXPECT_EQ(r.attempts[2].first_step, 5);
  EXPECT_EQ(r.tokens, 1200);
}

TEST(GoodputCalculator, FailedFinalAttemptKeepsOnlyCommittedSteps) {
  // Steps 0..5 (1 s each), a committed save of step 2 (3-3.5), then a failure with no restart.
  LogBuilder b;
  b.event(0, "job_start").attempt(0, 0);
  for (int s = 0; s <= 2; ++s) b.step(s, s, s + 1);
  b.save(2, 3, 3.5, "blocking", true);
  for (int s = 3; s <= 5; ++s) b.step(s, 0.5 + s, 1.5 + s);
  b.event(7, "failure", {{"signal", 0}, {"exit_code", 1}, {"message", "oom"}});
  b.event(7, "job_end", {{"status", "failed"}});
  const GoodputReport r = compute(b.text());
  EXPECT_NEAR(r.seconds_of(Category::kProductive), 3, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kWastedProgress), 3, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kCheckpointSave), 0.5, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kInfrastructureRecovery), 0.5, kTol);  // 6.5-7: failure to the end
  EXPECT_NEAR(sum_of_categories(r), 7, kTol);
  EXPECT_EQ(r.disruptions, 1);
}

// Steps 0..4 (0-5), blocking save 5-5.2, background part 5.2-8 while steps 5..9 run (5.2-10.2).
TEST(GoodputCalculator, AsyncCheckpointOnlyBlockingPartIsBadput) {
  LogBuilder b;
  b.event(0, "job_start").attempt(0, 0);
  for (int s = 0; s <= 4; ++s) b.step(s, s, s + 1);
  b.event(5, "checkpoint_save_start", {{"step", 4}, {"part", "blocking"}});
  b.event(5.2, "checkpoint_save_end", {{"step", 4}, {"part", "blocking"}, {"committed", false}});
  b.event(5.2, "checkpoint_save_start", {{"step", 4}, {"part", "background"}});
  for (int s = 5; s <= 9; ++s) {
    b.step(s, 0.2 + s, 1.2 + s);
    if (s == 7) b.event(8, "checkpoint_save_end", {{"step", 4}, {"part", "background"}, {"committed", true}});
  }
  b.event(10.2, "job_end");
  const GoodputReport r = compute(b.text());
  EXPECT_NEAR(r.total_s, 10.2, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kCheckpointSave), 0.2, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kProductive), 10, kTol);
  EXPECT_NEAR(r.goodput, 10 / 10.2, kTol);
  EXPECT_NEAR(sum_of_categories(r), r.total_s, kTol);
  ASSERT_EQ(r.background_saves.size(), 1u);
  EXPECT_NEAR(r.background_saves[0].second - r.background_saves[0].first, 2.8, kTol);
}

TEST(GoodputCalculator, OutOfOrderAndDuplicateStepEvents) {
  LogBuilder b = clean_run();
  std::vector<std::string>& lines = b.lines();
  // Duplicate a few lines exactly (a retried write) and add a second, later step_end of step 3.
  lines.push_back(lines[10]);
  lines.push_back(lines[11]);
  lines.push_back(R"({"v":1,"t":12.5,"type":"step_end","attempt":0,"step":3,"tokens":100,"model_flops":1e9})");
  std::mt19937 rng(7);
  std::shuffle(lines.begin() + 2, lines.end(), rng);  // merged ranks: any order
  const GoodputReport r = compute(b.text());
  expect_clean_figures(r);
  EXPECT_EQ(r.kept_steps, 10);
  EXPECT_EQ(r.tokens, 1000);
  EXPECT_TRUE(has_warning(r, "duplicate line")) << ::testing::PrintToString(r.warnings);
  EXPECT_TRUE(has_warning(r, "out of time order"));
  EXPECT_TRUE(has_warning(r, "step 3 ended twice"));
}

TEST(GoodputCalculator, TornLastLineIsToleratedAndReported) {
  std::string text = clean_run(/*with_end=*/false).text();
  text += R"({"v":1,"t":21,"type":"job_e)";  // the crash tore the last write
  const GoodputReport r = compute(text);
  EXPECT_TRUE(has_warning(r, "last line is torn"));
  EXPECT_TRUE(has_warning(r, "no job_end"));
  EXPECT_FALSE(r.finished);
  EXPECT_NEAR(r.total_s, 20, kTol);  // up to the last complete event (eval end)
  EXPECT_NEAR(r.seconds_of(Category::kProductive), 10, kTol);
  EXPECT_NEAR(r.goodput, 0.5, kTol);
  EXPECT_NEAR(sum_of_categories(r), r.total_s, kTol);
}

TEST(GoodputCalculator, LiveRunCountsUpToNow) {
  CalculatorOptions options;
  options.now = 30;
  const GoodputReport r = compute_goodput(parse_event_log(clean_run(false).text(), "live"), options);
  EXPECT_NEAR(r.total_s, 30, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kOther), 10, kTol);
}

TEST(GoodputCalculator, UnknownEventTypeIsIgnoredWithAWarning) {
  LogBuilder b = clean_run();
  b.lines().insert(b.lines().begin() + 5, R"({"v":1,"t":7,"type":"gpu_thermal_throttle","attempt":0})");
  b.lines().insert(b.lines().begin() + 6, R"({"v":2,"t":7.5,"type":"not_json_object_line"})");
  b.lines().insert(b.lines().begin() + 7, "garbage {");
  const GoodputReport r = compute(b.text());
  expect_clean_figures(r);
  EXPECT_TRUE(has_warning(r, "unknown event type 'gpu_thermal_throttle'"));
  EXPECT_TRUE(has_warning(r, "schema version newer"));
  EXPECT_TRUE(has_warning(r, "not a JSON object"));
}

// A field of the wrong type (a schema version that is a string, an attempt that is not a
// number) is read as absent: the report is made, never a JSON type error.
TEST(GoodputCalculator, FieldsOfTheWrongTypeAreIgnored) {
  LogBuilder b = clean_run();
  b.lines().insert(b.lines().begin() + 5, R"({"v":"two","t":7,"type":"gpu_thermal_throttle","attempt":"x"})");
  b.lines().insert(b.lines().begin() + 6, R"({"v":1e300,"t":7.2,"type":"gpu_thermal_throttle"})");
  GoodputReport r;
  ASSERT_NO_THROW(r = compute(b.text()));
  expect_clean_figures(r);
  EXPECT_TRUE(has_warning(r, "unknown event type 'gpu_thermal_throttle'"));
  EXPECT_FALSE(has_warning(r, "schema version newer")) << ::testing::PrintToString(r.warnings);
}

// Numbers that do not fit where they are read (an attempt of 2^40, a step count of
// 1e300) are read as absent, not narrowed or cast with undefined behaviour (UBSan checks
// this in the sanitizer build).
TEST(GoodputCalculator, NumbersThatDoNotFitAreReadAsAbsent) {
  LogBuilder b = clean_run();
  b.lines().insert(b.lines().begin() + 5, R"({"v":1,"t":7,"type":"gpu_thermal_throttle","attempt":1099511627776})");
  b.lines().insert(b.lines().begin() + 6, R"({"v":1,"t":7.1,"type":"gpu_thermal_throttle","attempt":2147483647})");
  GoodputReport r;
  ASSERT_NO_THROW(r = compute(b.text()));
  expect_clean_figures(r);

  Event event;
  event.fields = {{"huge", 1e300}, {"float", 1e3}, {"unsigned", UINT64_MAX}, {"text", "12"}, {"nan", nullptr}};
  EXPECT_EQ(event.integer("huge", 7), 7);
  EXPECT_EQ(event.integer("float", 7), 1000);
  EXPECT_EQ(event.integer("unsigned", 7), 7);
  EXPECT_EQ(event.integer("text", 7), 7);
  EXPECT_EQ(event.integer("nan", 7), 7);
  EXPECT_EQ(event.number("text", 2.5), 2.5);
  EXPECT_EQ(event.text("float", "none"), "none");
}

TEST(GoodputCalculator, ClockGoingBackwardsIsReportedAndThePartialReportKept) {
  LogBuilder b = clean_run();
  // Step 5's end written with a clock 3 s behind: it ends before it starts.
  for (std::string& line : b.lines())
    if (line.find("\"step_end\"") != std::string::npos && line.find("\"step\":5,") != std::string::npos)
      line = R"({"v":1,"t":11.0,"type":"step_end","attempt":0,"step":5,"tokens":100,"model_flops":1e9})";
  const GoodputReport r = compute(b.text());
  EXPECT_TRUE(has_warning(r, "clock went backwards")) << ::testing::PrintToString(r.warnings);
  EXPECT_EQ(r.kept_steps, 9);
  EXPECT_NEAR(sum_of_categories(r), r.total_s, kTol);
  EXPECT_NEAR(r.total_s, 21, kTol);
}

TEST(GoodputCalculator, MissingAndCorruptLogs) {
  const std::filesystem::path missing = std::filesystem::temp_directory_path() / "tessera_no_such_run/events.jsonl";
  try {
    read_event_log(missing);
    FAIL() << "expected IOError";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
  }
  const GoodputReport r = compute("\x01\x02 not json\n{\"t\":\"x\"}\n");
  EXPECT_NEAR(r.total_s, 0, kTol);
  EXPECT_TRUE(has_warning(r, "no events"));
  EXPECT_TRUE(has_warning(r, "missing or invalid"));
}

TEST(GoodputCalculator, SchedulingWaitFromLauncherRecords) {
  LogBuilder b = clean_run();
  // Queued 9 s before the job started: total 30 s, runtime goodput unchanged.
  b.lines().push_back(R"({"v":1,"t":0,"type":"launch_wait","start":-9,"end":0,"launcher":"slurm"})");
  const GoodputReport r = compute(b.text());
  EXPECT_TRUE(r.has_scheduling_records);
  EXPECT_NEAR(r.total_s, 30, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kSchedulingWait), 9, kTol);
  EXPECT_NEAR(r.scheduling_goodput, 21.0 / 30.0, kTol);
  EXPECT_NEAR(r.runtime_goodput, 10.0 / 21.0, kTol);
  EXPECT_NEAR(r.goodput, r.scheduling_goodput * r.runtime_goodput, kTol);
}

TEST(GoodputCalculator, CustomBadputAndCompileInsideTheFirstStep) {
  LogBuilder b;
  b.event(0, "job_start").attempt(0, 0);
  b.event(0, "step_start", {{"step", 0}});
  b.phase(0, 4, "compile", {{"cache_hit", false}});
  b.event(5, "step_end", {{"step", 0}, {"tokens", 10}, {"model_flops", 0}});
  for (int s = 1; s <= 4; ++s) b.step(s, 4 + s, 5 + s, 10, 0);
  b.phase(9, 11, "custom_badput", {{"badput_type", "sdc_check"}});
  b.event(11, "job_end");
  const GoodputReport r = compute(b.text());
  EXPECT_NEAR(r.seconds_of(Category::kCompile), 4, kTol);  // nested in step 0: compile wins
  EXPECT_NEAR(r.seconds_of(Category::kProgramStartup), 0, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kProductive), 5, kTol);
  EXPECT_NEAR(r.seconds_of(Category::kCustom), 2, kTol);
  EXPECT_NEAR(r.custom_seconds.at("sdc_check"), 2, kTol);
  EXPECT_FALSE(r.program_goodput.has_value());  // no device, no calibration, no FLOPs
  EXPECT_NEAR(sum_of_categories(r), 11, kTol);
}

// Pipeline steps carry the devices' idle share: the report sums bubble x step time over
// kept steps (out-of-range shares clamped), a figure inside productive time.
TEST(GoodputCalculator, PipelineBubbleSecondsOfKeptSteps) {
  LogBuilder b;
  b.event(0, "job_start").attempt(0, 0);
  const double bubbles[] = {0.25, 0.5, 1.5, -1};  // 1.5 counts as 1; -1 (not recorded) as 0
  for (int s = 0; s < 4; ++s) {
    b.event(2.0 * s, "step_start", {{"step", s}});
    b.event(2.0 * s + 2, "step_end",
            {{"step", s}, {"tokens", 10}, {"model_flops", 1}, {"pipeline_bubble", bubbles[s]}});
  }
  b.event(8, "job_end");
  const GoodputReport r = compute(b.text());
  EXPECT_NEAR(r.seconds_of(Category::kProductive), 8, kTol);
  EXPECT_NEAR(r.pipeline_bubble_s, 2 * (0.25 + 0.5 + 1.0), kTol);
  EXPECT_NE(format_table(r).find("pipeline bubble 3.50s of the productive time (43.8%)"), std::string::npos)
      << format_table(r);
  // Without the field, no figure.
  EXPECT_EQ(format_table(compute(clean_run().text())).find("pipeline bubble"), std::string::npos);
}

TEST(GoodputCalculator, StepStatisticsFlagSlowStepsByMad) {
  LogBuilder b;
  b.event(0, "job_start").attempt(0, 0);
  double t = 0;
  for (int s = 0; s < 30; ++s) {
    const double d = s == 17 ? 5.0 : 1.0 + 0.01 * (s % 3);
    b.step(s, t, t + d);
    t += d;
  }
  b.event(t, "job_end");
  const GoodputReport r = compute(b.text());
  EXPECT_NEAR(r.step_stats.median_s, 1.01, 1e-9);
  EXPECT_NEAR(r.step_stats.mad_s, 0.01, 1e-9);
  ASSERT_EQ(r.step_stats.anomalous.size(), 1u);
  EXPECT_EQ(r.step_stats.anomalous[0].second, 17);
  ASSERT_EQ(r.step_stats.windows.size(), 3u);
  EXPECT_NEAR(r.step_stats.windows[0].covered_s, std::min(60.0, t), 1e-9);
  EXPECT_EQ(r.step_stats.windows[2].steps, 30);
}

}  // namespace
}  // namespace tessera::goodput
