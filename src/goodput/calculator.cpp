// The goodput calculator: pairs start/end events into phases, classifies step
// executions as kept or wasted, and gives every second of the run to one category by
// a sweep over the phase boundaries (see calculator.h for the rules). The stages are
// GoodputComputation's methods (goodput_computation.h).
#include "tessera/goodput/calculator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "goodput/goodput_computation.h"
#include "tessera/base/statistics.h"

namespace tessera::goodput {
namespace {

constexpr std::array<std::pair<std::string_view, std::string_view>, kNumCategories> kCategoryNames{{
    {"productive", "productive (kept steps)"},
    {"scheduling_wait", "launch/scheduling wait"},
    {"init", "backend init"},
    {"compile", "compile"},
    {"checkpoint_restore", "checkpoint restore"},
    {"checkpoint_save", "checkpoint save (blocking)"},
    {"data_loading", "data loading (sync)"},
    {"wasted_progress", "wasted progress (disruption)"},
    {"infrastructure_recovery", "infrastructure recovery"},
    {"eval", "eval"},
    {"program_startup", "program start-up"},
    {"custom", "custom badput"},
    {"other", "other"},
}};

}  // namespace

namespace detail {

// ---- job bounds and per-attempt grouping; false when there is nothing to report ----
bool GoodputComputation::group_events() {
  std::optional<double> job_start, job_end;
  double first_t = std::numeric_limits<double>::infinity(), last_t = -first_t;
  for (const Event& e : log.events) {
    first_t = std::min(first_t, e.t);
    last_t = std::max(last_t, e.t);
    switch (e.type) {
      case EventType::kJobStart:
        if (!job_start) {
          job_start = e.t;
          r.job = e.text("job");
        }
        continue;
      case EventType::kJobEnd:
        job_end = e.t;  // the last one wins (a job may end, be resumed and end again)
        job_failed = e.text("status", "ok") != "ok";
        continue;
      case EventType::kLaunchWait: {
        const double s = e.number("start", e.t), en = e.number("end", e.t);
        if (en < s) {
          warn(fmt::format("line {}: launch_wait ends {:.3f} s before it starts; ignored", e.line, s - en));
        } else {
          launch_waits.emplace_back(s, en);
          first_t = std::min(first_t, s);
          last_t = std::max(last_t, en);
        }
        continue;
      }
      case EventType::kDevice:
        device = &e;
        continue;
      case EventType::kCalibration:
        calibration = &e;
        continue;
      case EventType::kRankStart:
      case EventType::kRankStep:
        continue;  // per-rank records (stragglers.h), not the job's wall time
      default:
        break;
    }
    AttemptInfo& a = attempts[e.attempt];
    a.summary.attempt = e.attempt;
    a.first_event = std::min(a.first_event, e.t);
    a.last_event = std::max(a.last_event, e.t);
    a.events.push_back(&e);
    if (e.type == EventType::kAttemptStart && !a.has_start_event) {
      a.has_start_event = true;
      a.summary.start = e.t;
      a.summary.reason = e.text("reason");
    }
    if (e.type == EventType::kFailure && !a.has_failure) {
      a.has_failure = true;
      a.failure_t = e.t;
      a.summary.failure = e.text("message", "failure");
    }
  }
  if (log.events.empty() || !std::isfinite(first_t)) {
    warn("no events: nothing to report");
    return false;
  }
  if (!job_start) warn("no job_start event: the run's start is taken as its first event");
  r.start = std::min(job_start.value_or(first_t), first_t);
  if (job_end && *job_end < r.start) {
    warn(fmt::format("job_end is {:.3f} s before the job's start (clock went backwards?); using the last event",
                     r.start - *job_end));
    job_end.reset();
  }
  r.finished = job_end.has_value();
  if (job_end) {
    r.end = std::max(*job_end, last_t);
  } else {
    r.end = std::max(last_t, options.now.value_or(last_t));
    warn("no job_end event: the run is still going or died without recording it; time counted up to " +
         std::string(options.now ? "now" : "the last event"));
  }
  r.total_s = r.end - r.start;
  return true;
}

// ---- attempts: bounds and disruption ----
void GoodputComputation::bound_attempts() {
  for (auto& [number, a] : attempts) order.push_back(&a);
  for (size_t i = 0; i < order.size(); ++i) {
    AttemptInfo& a = *order[i];
    if (!a.has_start_event) a.summary.start = i == 0 ? r.start : a.first_event;
    const bool has_next = i + 1 < order.size();
    a.summary.end = has_next ? order[i + 1]->summary.start : r.end;
    if (has_next) a.summary.end = std::max(a.summary.end, a.has_start_event ? a.summary.start : a.first_event);
    a.summary.disrupted = a.has_failure || has_next || (job_failed && !has_next);
  }
}

// ---- kept or wasted: progress is lost when a later attempt re-runs it, or when a
// failed final attempt has no committed checkpoint covering it ----
void GoodputComputation::classify_kept() {
  // failed final attempt has no committed checkpoint covering it ----
  std::map<int, int64_t> first_step_of;
  for (const StepExec& x : r.steps)
    if (!first_step_of.count(x.attempt) || x.step < first_step_of[x.attempt]) first_step_of[x.attempt] = x.step;
  for (size_t ai = 0; ai < order.size(); ++ai) {
    AttemptInfo& a = *order[ai];
    const int an = a.summary.attempt;
    std::optional<int64_t> resumed_at;
    for (size_t bi = ai + 1; bi < order.size(); ++bi)
      if (first_step_of.count(order[bi]->summary.attempt)) {
        const int64_t s = first_step_of[order[bi]->summary.attempt];
        resumed_at = resumed_at ? std::min(*resumed_at, s) : s;
      }
    std::optional<int64_t> last_checkpoint;
    for (size_t k = 0; k < committed.size(); ++k)
      if (committed[k].first <= an)
        last_checkpoint = last_checkpoint ? std::max(*last_checkpoint, committed[k].second) : committed[k].second;
    for (StepExec& x : r.steps) {
      if (x.attempt != an) continue;
      if (!a.summary.disrupted) {
        x.kept = true;
      } else if (!x.completed) {
        x.kept = false;
      } else if (resumed_at) {
        x.kept = x.step < *resumed_at;
      } else {
        x.kept = last_checkpoint && x.step <= *last_checkpoint;
      }
    }
  }
}

// ---- step intervals: [start, end] plus the loop's gap to the next step; launch
// waits; recovery windows ----
void GoodputComputation::add_step_and_recovery_intervals() {
  std::vector<double> measured;
  for (const StepExec& x : r.steps)
    if (x.completed) measured.push_back(x.end - x.start);
  const double median_step = median(measured);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepExec& x = r.steps[i];
    double end = x.end;
    if (x.completed && i + 1 < r.steps.size() && r.steps[i + 1].attempt == x.attempt) {
      const double gap = r.steps[i + 1].start - x.end;
      if (gap > 0 && gap <= median_step) end = r.steps[i + 1].start;
    }
    intervals.push_back(
        Interval{x.start, end, kStepPriority, Category::kProductive, x.attempt, static_cast<int>(i), {}});
  }
  for (const auto& [s, e] : launch_waits)
    intervals.push_back(Interval{s, e, kLaunchWaitPriority, Category::kSchedulingWait, -1, -1, {}});
  // Recovery windows: from the last step of a disrupted attempt to the next attempt's first step.
  for (size_t ai = 0; ai < order.size(); ++ai) {
    const AttemptInfo& a = *order[ai];
    if (!a.summary.disrupted) continue;
    double from = a.has_failure ? a.failure_t : a.last_event;
    double last_step_end = -std::numeric_limits<double>::infinity();
    for (const StepExec& x : r.steps)
      if (x.attempt == a.summary.attempt) last_step_end = std::max(last_step_end, x.end);
    if (std::isfinite(last_step_end)) from = last_step_end;
    double to = r.end;
    for (size_t bi = ai + 1; bi < order.size() && to == r.end; ++bi)
      for (const StepExec& x : r.steps)
        if (x.attempt == order[bi]->summary.attempt) {
          to = x.start;
          break;
        }
    if (to > from)
      intervals.push_back(
          Interval{from, to, kRecoveryWindow, Category::kInfrastructureRecovery, a.summary.attempt, -1, {}});
  }
}

// ---- sweep: every elementary stretch goes to the highest-priority interval over it ----
void GoodputComputation::sweep() {
  struct Boundary {
    double t;
    bool opens;
    int index;
  };
  std::vector<Boundary> bounds;
  for (size_t i = 0; i < intervals.size(); ++i) {
    Interval& iv = intervals[i];
    iv.start = std::clamp(iv.start, r.start, r.end);
    iv.end = std::clamp(iv.end, r.start, r.end);
    if (iv.end <= iv.start) continue;
    bounds.push_back({iv.start, true, static_cast<int>(i)});
    bounds.push_back({iv.end, false, static_cast<int>(i)});
  }
  std::sort(bounds.begin(), bounds.end(), [](const Boundary& a, const Boundary& b) { return a.t < b.t; });
  std::set<std::pair<int, int>> active;  // (priority, -index): the latest-added wins ties
  double cursor = r.start;
  auto emit = [&](double s, double e) {
    if (e <= s) return;
    Segment seg;
    seg.start = s;
    seg.end = e;
    if (!active.empty()) {
      const Interval& iv = intervals[-active.rbegin()->second];
      seg.category = iv.category;
      seg.attempt = iv.attempt;
      seg.custom_type = iv.custom_type;
      if (iv.exec >= 0) {
        StepExec& x = r.steps[iv.exec];
        seg.step = x.step;
        seg.category = x.kept ? Category::kProductive : Category::kWastedProgress;
        x.attributed_s += e - s;
      }
    }
    Segment* last = r.segments.empty() ? nullptr : &r.segments.back();
    if (last && last->end == s && last->category == seg.category && last->step == seg.step &&
        last->attempt == seg.attempt && last->custom_type == seg.custom_type)
      last->end = e;
    else
      r.segments.push_back(std::move(seg));
  };
  for (size_t i = 0; i < bounds.size();) {
    const double t = bounds[i].t;
    emit(cursor, t);
    cursor = std::max(cursor, t);
    for (; i < bounds.size() && bounds[i].t == t; ++i) {
      const std::pair<int, int> key{intervals[bounds[i].index].priority, -bounds[i].index};
      if (bounds[i].opens)
        active.insert(key);
      else
        active.erase(key);
    }
  }
  emit(cursor, r.end);
}

// ---- program start-up: the first kept step's excess over the median kept step ----
void GoodputComputation::attribute_startup() {
  std::vector<double> attributed;
  {
    std::map<int, int> first_of_attempt;
    for (size_t i = 0; i < r.steps.size(); ++i)
      if (!first_of_attempt.count(r.steps[i].attempt)) first_of_attempt[r.steps[i].attempt] = static_cast<int>(i);
    for (const auto& [attempt, idx] : first_of_attempt) first_exec.insert(idx);
    for (size_t i = 0; i < r.steps.size(); ++i)
      if (r.steps[i].kept && r.steps[i].completed && !first_exec.count(static_cast<int>(i)))
        attributed.push_back(r.steps[i].attributed_s);
  }
  const double median_attributed = median(attributed);
  for (int idx : first_exec) {
    StepExec& x = r.steps[idx];
    if (!x.kept || attributed.empty()) continue;
    double excess = std::max(0.0, x.attributed_s - median_attributed);
    if (excess <= 0) continue;
    for (size_t s = 0; s < r.segments.size() && excess > 0; ++s) {
      Segment& seg = r.segments[s];
      if (seg.category != Category::kProductive || seg.attempt != x.attempt || seg.step != x.step) continue;
      const double take = std::min(excess, seg.end - seg.start);
      if (take >= seg.end - seg.start) {
        seg.category = Category::kProgramStartup;
      } else {
        Segment head = seg;
        head.end = seg.start + take;
        head.category = Category::kProgramStartup;
        seg.start = head.end;
        r.segments.insert(r.segments.begin() + static_cast<std::ptrdiff_t>(s), head);
        ++s;
      }
      excess -= take;
    }
  }
}

// ---- totals ----
void GoodputComputation::totals() {
  for (const Segment& seg : r.segments) {
    r.seconds[static_cast<int>(seg.category)] += seg.end - seg.start;
    if (seg.category == Category::kCustom) r.custom_seconds[seg.custom_type] += seg.end - seg.start;
  }
  for (const StepExec& x : r.steps) {
    if (x.kept) {
      ++r.kept_steps;
      r.tokens += x.tokens;
      r.model_flops += x.model_flops;
      r.pipeline_bubble_s += x.pipeline_bubble * (x.end - x.start);
    } else {
      ++r.wasted_steps;
    }
  }
  for (AttemptInfo* a : order) {
    for (const StepExec& x : r.steps)
      if (x.attempt == a->summary.attempt) {
        if (a->summary.first_step < 0) a->summary.first_step = x.step;
        a->summary.last_step = x.step;
        ++a->summary.steps;
      }
    if (a->summary.disrupted) ++r.disruptions;
    r.attempts.push_back(a->summary);
  }
}

// ---- goodput, its factors and MFU ----
void GoodputComputation::goodput_ratios() {
  const double productive = r.seconds_of(Category::kProductive);
  const double waiting = r.seconds_of(Category::kSchedulingWait);
  r.has_scheduling_records = !launch_waits.empty();
  if (r.total_s > 0) {
    r.goodput = productive / r.total_s;
    r.scheduling_goodput = (r.total_s - waiting) / r.total_s;
    r.runtime_goodput = r.total_s > waiting ? productive / (r.total_s - waiting) : 0;
    r.effective_tokens_per_s = static_cast<double>(r.tokens) / r.total_s;
  }
  if (!r.has_scheduling_records)
    r.notes.push_back(
        "no launcher wait records: Scheduling Goodput taken as 1.0 (time before the job started is not seen)");
  if (productive > 0) r.tokens_per_s = static_cast<double>(r.tokens) / productive;

  if (device && device->number("peak_flops_per_device") > 0) {
    const int64_t count = std::max<int64_t>(1, device->integer("count", 1));
    r.peak_flops = device->number("peak_flops_per_device") * static_cast<double>(count);
    r.peak_source = fmt::format("{} x {} ({})", count, device->text("name", "device"), device->text("source", "?"));
  } else if (calibration && calibration->number("peak_flops") > 0) {
    r.peak_flops = calibration->number("peak_flops");
    r.peak_source = fmt::format("CPU calibration GEMM ({}, n={}): MFU is relative to this measured rate",
                                calibration->text("method", "?"), calibration->integer("n", 0));
  }
  if (r.peak_flops > 0 && productive > 0 && r.model_flops > 0) {
    r.program_goodput = r.model_flops / productive / r.peak_flops;
    r.ml_productivity_goodput = r.scheduling_goodput * r.runtime_goodput * *r.program_goodput;
  } else if (r.peak_flops <= 0) {
    r.notes.push_back("no device or calibration record: Program Goodput (MFU) unknown");
  } else {
    r.notes.push_back("no model FLOPs in the step records: Program Goodput (MFU) unknown");
  }
  if (r.peak_flops > 0) r.notes.push_back("peak FLOP/s from " + r.peak_source);
}

// ---- step-time statistics ----
void GoodputComputation::step_statistics() {
  StepStats& st = r.step_stats;
  std::vector<double> durations;
  for (const StepExec& x : r.steps)
    if (x.completed) durations.push_back(x.end - x.start);
  st.count = static_cast<int64_t>(durations.size());
  if (!durations.empty()) {
    st.median_s = median(durations);
    std::vector<double> dev;
    for (double d : durations) dev.push_back(std::fabs(d - st.median_s));
    st.mad_s = median(dev);
    double sum = 0;
    for (double d : durations) sum += d;
    st.mean_s = sum / static_cast<double>(durations.size());
    st.min_s = *std::min_element(durations.begin(), durations.end());
    st.max_s = *std::max_element(durations.begin(), durations.end());
    // 1.4826 MAD estimates the standard deviation of normal data; the floor of 5% of the
    // median keeps perfectly regular runs from flagging microsecond jitter.
    const double scale = std::max(1.4826 * st.mad_s, 0.05 * st.median_s);
    for (size_t i = 0; i < r.steps.size(); ++i) {
      const StepExec& x = r.steps[i];
      if (!x.completed || first_exec.count(static_cast<int>(i))) continue;
      if (std::fabs((x.end - x.start) - st.median_s) > options.anomaly_mads * scale)
        st.anomalous.emplace_back(x.attempt, x.step);
    }
  }
  for (double window : {60.0, 300.0, 900.0}) {
    WindowStats w;
    w.window_s = window;
    const double from = std::max(r.start, r.end - window);
    w.covered_s = r.end - from;
    double productive_in = 0;
    for (const Segment& seg : r.segments)
      if (seg.category == Category::kProductive)
        productive_in += std::max(0.0, std::min(seg.end, r.end) - std::max(seg.start, from));
    std::vector<double> in;
    int64_t tokens = 0;
    for (const StepExec& x : r.steps)
      if (x.completed && x.end > from) {
        ++w.steps;
        tokens += x.kept ? x.tokens : 0;
        in.push_back(x.end - x.start);
      }
    if (w.covered_s > 0) {
      w.goodput = productive_in / w.covered_s;
      w.tokens_per_s = static_cast<double>(tokens) / w.covered_s;
    }
    w.median_step_s = median(in);
    st.windows.push_back(w);
  }
}

}  // namespace detail

std::string_view category_name(Category category) { return kCategoryNames[static_cast<int>(category)].first; }
std::string_view category_label(Category category) { return kCategoryNames[static_cast<int>(category)].second; }

GoodputReport compute_goodput(const EventLog& log, const CalculatorOptions& options) {
  return detail::GoodputComputation(log, options).run();
}

}  // namespace tessera::goodput
