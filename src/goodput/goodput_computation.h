// Internal to the goodput calculator: the state compute_goodput builds up, and its
// stages as methods (calculator.cpp; the pairing of start/end events into phases in
// phase_pairing.cpp).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/goodput/calculator.h"

namespace tessera::goodput::detail {

// Where overlapping phases compete for the same second, the higher priority wins.
enum Priority : int {
  kRecoveryWindow = 1,
  kStepPriority = 20,
  kDataWaitPriority = 30,
  kInitPriority = 40,
  kCompilePriority = 50,
  kRestorePriority = 60,
  kSavePriority = 70,
  kEvalPriority = 80,
  kCustomPriority = 90,
  kLaunchWaitPriority = 100,
};

struct Interval {
  double start = 0, end = 0;
  int priority = 0;
  Category category = Category::kOther;
  int attempt = -1;
  int exec = -1;  // index into steps for step intervals
  std::string custom_type;
};

struct Open {
  double t = 0;
  int line = 0;
};

struct AttemptInfo {
  AttemptSummary summary;
  double first_event = std::numeric_limits<double>::infinity();
  double last_event = -std::numeric_limits<double>::infinity();
  bool has_start_event = false;
  bool has_failure = false;
  double failure_t = 0;
  std::vector<const Event*> events;
};

// One attempt's open phases while its events are paired.
struct AttemptPhases {
  explicit AttemptPhases(AttemptInfo& attempt) : a(attempt), an(attempt.summary.attempt) {}
  AttemptInfo& a;
  int an = -1;
  double cut = 0;  // where open phases are closed: the disruption, or the end of the run
  std::map<std::string, Open> open;
  std::map<int64_t, int> step_exec;         // step -> index into r.steps, for this attempt
  std::map<int64_t, const Event*> orphans;  // step_end seen before any step_start
};

// compute_goodput's stages, in order (run()): group the events by attempt, bound the
// attempts, pair start/end events into phases, mark each step execution kept or wasted,
// add the step and recovery intervals, sweep the intervals into segments, attribute
// program start-up, then totals, goodput ratios and step-time statistics.
class GoodputComputation {
 public:
  GoodputComputation(const EventLog& log, const CalculatorOptions& options) : log(log), options(options) {
    r.warnings = log.warnings;
  }

  GoodputReport run() {
    if (!group_events()) return std::move(r);
    bound_attempts();
    pair_phases();
    classify_kept();
    add_step_and_recovery_intervals();
    sweep();
    attribute_startup();
    totals();
    goodput_ratios();
    step_statistics();
    return std::move(r);
  }

 private:
  const EventLog& log;
  const CalculatorOptions& options;
  GoodputReport r;
  bool job_failed = false;
  std::map<int, AttemptInfo> attempts;
  std::vector<AttemptInfo*> order;  // attempts by number
  std::vector<std::pair<double, double>> launch_waits;
  const Event* device = nullptr;
  const Event* calibration = nullptr;
  std::vector<Interval> intervals;
  std::vector<std::pair<int, int64_t>> committed;  // (attempt, checkpoint step)
  std::set<int> first_exec;                        // each attempt's first step execution

  void warn(std::string message) { r.warnings.push_back(std::move(message)); }

  // ---- job bounds and per-attempt grouping; false when there is nothing to report ----
  bool group_events();

  // ---- attempts: bounds and disruption ----
  void bound_attempts();

  // ---- pair start/end events into phases ----
  void pair_phases();

  void begin(AttemptPhases& p, const std::string& key, const Event& e, const char* what);

  std::optional<Open> finish(AttemptPhases& p, const std::string& key, const Event& e, const char* what);

  void add(const AttemptPhases& p, double s, double en, int priority, Category c, std::string custom = {});

  // Every event but the steps': the phase it opens or closes.
  void on_phase_event(AttemptPhases& p, const Event& e);

  void on_step_start(AttemptPhases& p, const Event& e);

  void on_step_end(AttemptPhases& p, const Event& e);

  // Phases and steps still open when the attempt ends close at its cut.
  void close_open_phases(AttemptPhases& p);

  // ---- kept or wasted: progress is lost when a later attempt re-runs it, or when a
  // failed final attempt has no committed checkpoint covering it ----
  void classify_kept();

  // ---- step intervals: [start, end] plus the loop's gap to the next step; launch
  // waits; recovery windows ----
  void add_step_and_recovery_intervals();

  // ---- sweep: every elementary stretch goes to the highest-priority interval over it ----
  void sweep();

  // ---- program start-up: the first kept step's excess over the median kept step ----
  void attribute_startup();

  // ---- totals ----
  void totals();

  // ---- goodput, its factors and MFU ----
  void goodput_ratios();

  // ---- step-time statistics ----
  void step_statistics();
};

}  // namespace tessera::goodput::detail
