// The supervisor's hang detector: per rank, the step and phase its heartbeat file last
// showed and when (on the supervisor's clock) either changed. A rank is hung when it
// stays in one place longer than its phase allows:
//   step      (training steps) the fixed --hang-timeout S, or automatically
//             max(auto_floor_s, auto_factor x the median step time), or first_steps_s
//             while no step time is known yet;
//   eval, save  max(phase_floor_s, auto_factor x the duration the worker expects for
//             it, sent in the heartbeat), or startup_s without an expectation;
//   startup, restore, compile, and a rank with no heartbeat yet in this attempt:
//             startup_s.
// Step times come from the heartbeats' own timestamps (step-to-step intervals of two
// beats both in the step phase, divided by the steps in between), kept across attempts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::launch {

struct HangPolicy {
  std::optional<double> timeout_s;  // step phase; nullopt: automatic
  double startup_s = 600;           // start-up, restore, compile (and before a rank's first heartbeat)
  double auto_floor_s = 3;
  double auto_factor = 5;
  double first_steps_s = 60;  // step phase before any step time is known
  double phase_floor_s = 60;  // eval and save with an expected duration
};

// What one heartbeat says (train/heartbeat.h).
struct Progress {
  int64_t step = -1;
  std::string phase = "step";
  double worker_time = 0;
  std::optional<double> expect_s;  // the worker's estimate of the phase's length
};

class HangDetector {
 public:
  HangDetector(int ranks, HangPolicy policy);

  // A new attempt starts at `now`: every rank is unseen again (step times are kept).
  void start_attempt(double now);
  // A heartbeat of `rank` read at `now`.
  void observe(int rank, const Progress& progress, double now);
  // Shorthand: a step-phase beat, `step` steps done, written at `worker_time`.
  void observe(int rank, int64_t step, double worker_time, double now) {
    observe(rank, Progress{step, "step", worker_time, std::nullopt}, now);
  }
  // The rank exited successfully: it is no longer watched.
  void finished(int rank);

  // "hang: ..." when a watched rank is overdue at `now`, else nullopt.
  std::optional<std::string> check(double now) const;
  // The rank check() blames (valid right after check() returned a hang).
  int hung_rank(double now) const;

  double progress_timeout_s() const;  // the current limit between steps
  std::optional<double> median_step_s() const;
  int64_t last_step(int rank) const;  // -1 before the rank's first heartbeat in this attempt
  // Whether any rank completed a training step in this attempt (a step-phase beat).
  bool made_progress() const;

 private:
  struct Rank {
    int64_t step = -1;
    std::string phase;  // empty before the first heartbeat
    std::optional<double> expect_s;
    double worker_time = 0;
    double changed_at = 0;  // supervisor clock
    bool stepped = false;   // a step-phase beat seen in this attempt
    bool done = false;
  };
  // The limit for a rank where it is now, and a description for the message.
  double limit_s(const Rank& r) const;
  std::optional<std::string> overdue(size_t i, double now) const;

  HangPolicy policy_;
  std::vector<Rank> ranks_;
  double attempt_start_ = 0;
  std::vector<double> step_seconds_;
};

}  // namespace tessera::launch
