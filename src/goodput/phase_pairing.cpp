// The goodput calculator's first pass over each attempt: start/end events become
// phase intervals (init, compile, restore, blocking saves, data waits, evals, custom
// badput), step events become step executions, and whatever is still open when the
// attempt ends is closed at its cut, with a warning naming the line.
#include <fmt/format.h>

#include <algorithm>

#include "goodput/goodput_computation.h"

namespace tessera::goodput::detail {

// ---- pair start/end events into phases ----
void GoodputComputation::pair_phases() {
  for (AttemptInfo* a : order) {
    AttemptPhases p(*a);
    p.cut = a->has_failure ? a->failure_t : (a->summary.disrupted ? a->last_event : a->summary.end);
    for (const Event* e : a->events) {
      if (e->type == EventType::kStepStart)
        on_step_start(p, *e);
      else if (e->type == EventType::kStepEnd)
        on_step_end(p, *e);
      else
        on_phase_event(p, *e);
    }
    close_open_phases(p);
  }
  std::stable_sort(r.steps.begin(), r.steps.end(), [](const StepExec& a, const StepExec& b) {
    return a.attempt != b.attempt ? a.attempt < b.attempt : a.start < b.start;
  });
}

void GoodputComputation::begin(AttemptPhases& p, const std::string& key, const Event& e, const char* what) {
  if (p.open.count(key)) {
    warn(fmt::format("line {}: {} started again while open since line {} (attempt {}); kept the first", e.line, what,
                     p.open[key].line, p.an));
    return;
  }
  p.open[key] = Open{e.t, e.line};
}

std::optional<Open> GoodputComputation::finish(AttemptPhases& p, const std::string& key, const Event& e,
                                               const char* what) {
  const auto it = p.open.find(key);
  if (it == p.open.end()) {
    warn(fmt::format("line {}: {} end without a start (attempt {}); ignored", e.line, what, p.an));
    return std::nullopt;
  }
  Open o = it->second;
  p.open.erase(it);
  if (e.t < o.t) {
    warn(fmt::format("line {}: clock went backwards: {} ends {:.3f} s before it starts (line {}); ignored", e.line,
                     what, o.t - e.t, o.line));
    return std::nullopt;
  }
  return o;
}

void GoodputComputation::add(const AttemptPhases& p, double s, double en, int priority, Category c,
                             std::string custom) {
  intervals.push_back(Interval{s, en, priority, c, p.an, -1, std::move(custom)});
}

// Every event but the steps': the phase it opens or closes.
void GoodputComputation::on_phase_event(AttemptPhases& p, const Event& e) {
  switch (e.type) {
    case EventType::kBackendInitStart:
      begin(p, "init", e, "backend_init");
      break;
    case EventType::kBackendInitEnd:
      if (auto o = finish(p, "init", e, "backend_init")) add(p, o->t, e.t, kInitPriority, Category::kInit);
      break;
    case EventType::kCompileStart:
      begin(p, "compile", e, "compile");
      break;
    case EventType::kCompileEnd:
      if (auto o = finish(p, "compile", e, "compile")) add(p, o->t, e.t, kCompilePriority, Category::kCompile);
      break;
    case EventType::kCheckpointRestoreStart:
      begin(p, "restore", e, "checkpoint_restore");
      break;
    case EventType::kCheckpointRestoreEnd:
      if (auto o = finish(p, "restore", e, "checkpoint_restore"))
        add(p, o->t, e.t, kRestorePriority, Category::kCheckpointRestore);
      break;
    case EventType::kCheckpointSaveStart:
      begin(p, "save:" + e.text("part", "blocking"), e, "checkpoint_save");
      break;
    case EventType::kCheckpointSaveEnd: {
      const std::string part = e.text("part", "blocking");
      if (auto o = finish(p, "save:" + part, e, "checkpoint_save")) {
        if (part == "background")
          r.background_saves.emplace_back(o->t, e.t);
        else
          add(p, o->t, e.t, kSavePriority, Category::kCheckpointSave);
      }
      if (e.flag("committed")) committed.emplace_back(p.an, e.integer("step"));
      break;
    }
    case EventType::kDataWaitStart:
      begin(p, "data", e, "data_wait");
      break;
    case EventType::kDataWaitEnd:
      if (auto o = finish(p, "data", e, "data_wait")) add(p, o->t, e.t, kDataWaitPriority, Category::kDataLoading);
      break;
    case EventType::kEvalStart:
      begin(p, "eval", e, "eval");
      break;
    case EventType::kEvalEnd:
      if (auto o = finish(p, "eval", e, "eval")) add(p, o->t, e.t, kEvalPriority, Category::kEval);
      break;
    case EventType::kCustomBadputStart:
      begin(p, "custom:" + e.text("badput_type", "unknown"), e, "custom_badput");
      break;
    case EventType::kCustomBadputEnd: {
      const std::string type = e.text("badput_type", "unknown");
      if (auto o = finish(p, "custom:" + type, e, "custom_badput"))
        add(p, o->t, e.t, kCustomPriority, Category::kCustom, type);
      break;
    }
    default:
      break;
  }
}

void GoodputComputation::on_step_start(AttemptPhases& p, const Event& e) {
  const int64_t step = e.integer("step");
  if (const auto orphan = p.orphans.find(step); orphan != p.orphans.end()) {
    warn(
        fmt::format("line {}: clock went backwards: step {} ends {:.3f} s before it starts (line {}); step "
                    "ignored",
                    orphan->second->line, step, e.t - orphan->second->t, e.line));
    p.orphans.erase(orphan);
    p.step_exec[step] = -1;
    return;
  }
  if (p.step_exec.count(step)) {
    warn(fmt::format("line {}: step {} started again in attempt {}; kept the first execution", e.line, step, p.an));
    return;
  }
  p.step_exec[step] = static_cast<int>(r.steps.size());
  r.steps.push_back(StepExec{.attempt = p.an, .step = step, .start = e.t, .end = e.t});
}

void GoodputComputation::on_step_end(AttemptPhases& p, const Event& e) {
  const int64_t step = e.integer("step");
  const auto it = p.step_exec.find(step);
  if (it == p.step_exec.end()) {
    p.orphans.emplace(step, &e);
    return;
  }
  if (it->second < 0) return;  // a step already dropped
  StepExec& x = r.steps[it->second];
  if (x.completed) {
    warn(fmt::format("line {}: step {} ended twice in attempt {}; kept the first", e.line, step, p.an));
    return;
  }
  if (e.t < x.start) {
    warn(fmt::format("line {}: clock went backwards: step {} ends {:.3f} s before it starts; step ignored", e.line,
                     step, x.start - e.t));
    const int erased = it->second;
    r.steps.erase(r.steps.begin() + erased);
    p.step_exec.erase(it);
    for (auto& [s, idx] : p.step_exec)
      if (idx > erased) --idx;
    p.step_exec[step] = -1;
    return;
  }
  x.end = e.t;
  x.completed = true;
  x.tokens = std::max<int64_t>(0, e.integer("tokens", 0));
  x.model_flops = std::max(0.0, e.number("model_flops", 0));
  x.pipeline_bubble = std::clamp(e.number("pipeline_bubble", 0), 0.0, 1.0);
}

// Phases and steps still open when the attempt ends close at its cut.
void GoodputComputation::close_open_phases(AttemptPhases& p) {
  for (const auto& [key, o] : p.open) {
    const double end = std::max(o.t, p.cut);
    warn(fmt::format("line {}: {} never ended in attempt {}; closed at {}", o.line, key, p.an,
                     p.a.summary.disrupted ? "the disruption" : "the end of the run"));
    if (key == "init") add(p, o.t, end, kInitPriority, Category::kInit);
    if (key == "compile") add(p, o.t, end, kCompilePriority, Category::kCompile);
    if (key == "restore") add(p, o.t, end, kRestorePriority, Category::kCheckpointRestore);
    if (key == "save:blocking") add(p, o.t, end, kSavePriority, Category::kCheckpointSave);
    if (key == "data") add(p, o.t, end, kDataWaitPriority, Category::kDataLoading);
    if (key == "eval") add(p, o.t, end, kEvalPriority, Category::kEval);
    if (key.starts_with("custom:")) add(p, o.t, end, kCustomPriority, Category::kCustom, key.substr(7));
  }
  for (const auto& [step, orphan] : p.orphans)
    warn(fmt::format("line {}: step_end of step {} without a step_start (attempt {}); ignored", orphan->line, step,
                     p.an));
  for (auto& [step, idx] : p.step_exec) {
    if (idx < 0) continue;
    StepExec& x = r.steps[idx];
    if (!x.completed) x.end = std::max(x.start, p.a.summary.disrupted ? p.cut : r.end);
  }
}

}  // namespace tessera::goodput::detail
