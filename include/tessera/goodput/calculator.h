// Where a run's time went: goodput and badput by category from the event log.
//
// Every second between the job's start (or an earlier launcher wait) and its end is
// given to exactly one category, so the categories sum to the total:
//
//   - recorded phases win by priority where they overlap: launcher wait > custom badput
//     > eval > blocking checkpoint save > checkpoint restore > compile > backend init
//     > data wait > step (a compile inside the first step is compile, not step time);
//   - a step owns [step_start, step_end] plus the loop's own gap up to the next step
//     when that gap is at most the median step time (longer gaps are "other");
//   - a step whose progress was lost (the next attempt resumed at or before it, or it
//     came after the last committed checkpoint of a failed final attempt, or it was
//     cut off by a failure) is wasted progress, counted once, whatever was re-run later;
//   - the first kept step of each attempt is productive up to the median step time;
//     its excess is program start-up;
//   - unrecorded time from the last step of a disrupted attempt to the next attempt's
//     first step is infrastructure recovery; any other unrecorded time is "other".
//
// Runtime Goodput = productive / (total - scheduling wait); Scheduling Goodput =
// (total - scheduling wait) / total (1.0 without launcher records); Program Goodput =
// MFU = model FLOPs of kept steps / productive seconds / peak FLOP/s; their product is
// the ML Productivity Goodput. docs/goodput.md has the details.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/goodput/events.h"
#include "tessera/goodput/stragglers.h"

namespace tessera::goodput {

enum class Category {
  kProductive,
  kSchedulingWait,
  kInit,
  kCompile,
  kCheckpointRestore,
  kCheckpointSave,
  kDataLoading,
  kWastedProgress,
  kInfrastructureRecovery,
  kEval,
  kProgramStartup,
  kCustom,
  kOther,
};
inline constexpr int kNumCategories = 13;

std::string_view category_name(Category category);   // "wasted_progress" (JSON keys)
std::string_view category_label(Category category);  // "wasted progress (disruption)" (tables)

// A stretch of wall time given to one category.
struct Segment {
  double start = 0, end = 0;
  Category category = Category::kOther;
  int attempt = -1;
  int64_t step = -1;        // for step time (productive, wasted, start-up)
  std::string custom_type;  // for kCustom
};

// One execution of a step (a step re-run after a restart is a second execution).
struct StepExec {
  int attempt = 0;
  int64_t step = 0;
  double start = 0, end = 0;  // end: step_end, or where an unfinished step was cut off
  bool completed = false;
  bool kept = true;  // false: wasted progress
  int64_t tokens = 0;
  double model_flops = 0;
  // Pipeline parallelism: the share of the devices' time in the step spent idle in the
  // schedule's bubble (step_end's "pipeline_bubble"); 0 without a pipeline.
  double pipeline_bubble = 0;
  double attributed_s = 0;  // wall time the timeline gave this execution
};

struct AttemptSummary {
  int attempt = 0;
  double start = 0, end = 0;
  std::string reason;  // why the previous attempt ended (from attempt_start)
  bool disrupted = false;
  std::string failure;  // the failure message, if one was recorded
  int64_t first_step = -1, last_step = -1;
  int64_t steps = 0;
};

struct WindowStats {
  double window_s = 0;   // nominal: 60, 300, 900
  double covered_s = 0;  // the part of it inside the run
  double goodput = 0;    // productive / covered
  int64_t steps = 0;
  double tokens_per_s = 0;
  double median_step_s = 0;
};

struct StepStats {
  int64_t count = 0;  // completed executions
  double median_s = 0, mad_s = 0, mean_s = 0, min_s = 0, max_s = 0;
  std::vector<std::pair<int, int64_t>> anomalous;  // (attempt, step): |t - median| > k * 1.4826 MAD
  std::vector<WindowStats> windows;                // last 1, 5, 15 minutes
};

struct GoodputReport {
  std::string job;
  double start = 0, end = 0, total_s = 0;
  bool finished = false;  // a job_end was recorded
  std::array<double, kNumCategories> seconds{};
  std::map<std::string, double> custom_seconds;  // kCustom by badput type

  double goodput = 0;             // productive / total = scheduling x runtime
  double runtime_goodput = 0;     // productive / (total - scheduling wait)
  double scheduling_goodput = 1;  // (total - scheduling wait) / total
  bool has_scheduling_records = false;
  std::optional<double> program_goodput;  // MFU; nullopt without a device or calibration record
  std::optional<double> ml_productivity_goodput;
  double peak_flops = 0;
  std::string peak_source;

  int disruptions = 0;
  int64_t kept_steps = 0, wasted_steps = 0;
  int64_t tokens = 0;      // of kept steps
  double model_flops = 0;  // of kept steps
  // Of the productive time, the devices' idle share inside kept steps' pipeline bubbles
  // (sum of bubble fraction x step time); 0 without a pipeline axis. Part of productive
  // time, not a category: the steps are kept, but the idle devices lower MFU.
  double pipeline_bubble_s = 0;
  double tokens_per_s = 0;            // kept tokens / productive seconds
  double effective_tokens_per_s = 0;  // kept tokens / total seconds

  std::vector<AttemptSummary> attempts;
  std::vector<StepExec> steps;
  std::vector<Segment> segments;  // time order, covering [start, end]
  std::vector<std::pair<double, double>> background_saves;
  StepStats step_stats;
  // From the per-rank logs (report_for_run reads them; compute_goodput leaves it empty).
  StragglerReport stragglers;

  std::vector<std::string> warnings;  // the reader's and the calculator's
  std::vector<std::string> notes;     // how figures were obtained (peak source, no scheduling records)

  double seconds_of(Category c) const { return seconds[static_cast<int>(c)]; }
  double fraction_of(Category c) const { return total_s > 0 ? seconds_of(c) / total_s : 0; }
};

struct CalculatorOptions {
  // For a run still going (no job_end): count up to this time instead of the last event.
  std::optional<double> now;
  double anomaly_mads = 3.0;
};

// Never throws on bad content: problems become warnings and the report is partial.
GoodputReport compute_goodput(const EventLog& log, const CalculatorOptions& options = {});

}  // namespace tessera::goodput
