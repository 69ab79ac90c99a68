// The supervisor's hang detector: per rank, the step its heartbeat file last showed
// and when (on the supervisor's clock) that step changed. A rank that has not moved
// for the progress timeout is hung; before its first heartbeat of an attempt a rank
// gets the start-up allowance instead (loading, restoring, compiling).
//
// The progress timeout is fixed (--hang-timeout S) or automatic:
//   max(auto_floor_s, auto_factor x median step time seen so far)
// where step times come from the heartbeats' own timestamps (step-to-step intervals
// divided by the steps in between), kept across attempts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::launch {

struct HangPolicy {
  std::optional<double> timeout_s;  // nullopt: automatic
  double startup_s = 600;           // allowance before a rank's first heartbeat in an attempt
  double auto_floor_s = 60;
  double auto_factor = 10;
};

class HangDetector {
 public:
  HangDetector(int ranks, HangPolicy policy);

  // A new attempt starts at `now`: every rank is unseen again (step times are kept).
  void start_attempt(double now);
  // A heartbeat of `rank` read at `now`: `step` steps done, written at `worker_time`.
  void observe(int rank, int64_t step, double worker_time, double now);
  // The rank exited successfully: it is no longer watched.
  void finished(int rank);

  // "hang: ..." when a watched rank is overdue at `now`, else nullopt.
  std::optional<std::string> check(double now) const;

  double progress_timeout_s() const;  // the current timeout between steps
  std::optional<double> median_step_s() const;
  int64_t last_step(int rank) const;  // -1 before the rank's first heartbeat in this attempt

 private:
  struct Rank {
    int64_t step = -1;
    double worker_time = 0;
    double changed_at = 0;  // supervisor clock
    bool done = false;
  };
  HangPolicy policy_;
  std::vector<Rank> ranks_;
  double attempt_start_ = 0;
  std::vector<double> step_seconds_;
};

}  // namespace tessera::launch
