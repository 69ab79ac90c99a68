// Straggler attribution: which rank each step waited for, and how long, from the
// per-rank step records (rank_log.h) of a job.
//
// A rank's own time in a step is its wall time minus the time it spent inside
// collectives: in synchronous training every rank's step lasts as long as the slowest
// one's (the others wait in the collective), so the wall times agree and the own times
// tell who was waited for. Ranks that share no collective (independent trainers) have
// own time = wall time. For each step recorded by two or more ranks:
//
//   slowest  = argmax_r own_r          (ties: the lowest rank)
//   excess   = own_slowest - median_r own_r
//   lost_s   = sum over steps of excess         (the job's seconds lost to stragglers)
//
// and each step's excess is charged to its slowest rank. The slowest rank overall is the
// one charged the most seconds. A step counts as a straggler step when its excess is
// more than `threshold` of its median (default 5%, above timing noise).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tessera/goodput/events.h"

namespace tessera::goodput {

// One step as the ranks saw it.
struct StepStraggler {
  int attempt = 0;
  int64_t step = 0;
  int ranks = 0;          // ranks that recorded it
  int slowest_rank = -1;  // argmax of own time
  double slowest_s = 0;   // the slowest rank's own time
  double median_s = 0;    // median own time over the ranks
  double fastest_s = 0;   // the fastest rank's own time
  double excess_s() const { return slowest_s - median_s; }
};

struct RankStragglerStats {
  int rank = 0;
  int64_t steps = 0;          // steps it recorded
  int64_t slowest_count = 0;  // steps (of those compared) where it was the slowest
  double lost_s = 0;          // excess charged to it
  double median_own_s = 0;    // its median own time per step
  double data_wait_s = 0;     // total over its steps
  double collective_s = 0;    // total over its steps
};

struct StragglerReport {
  bool present = false;                   // per-rank logs were found
  int world_size = 0;                     // the largest world size a rank recorded (at least the ranks seen)
  std::vector<RankStragglerStats> ranks;  // by rank, those with a log
  std::vector<StepStraggler> steps;       // steps recorded by 2+ ranks, by (attempt, step)
  std::vector<StepStraggler> worst;       // the largest excesses, largest first
  double lost_s = 0;                      // sum of excess over steps
  int64_t straggler_steps = 0;            // steps whose excess > threshold x median
  int slowest_rank = -1;                  // the rank charged the most seconds; -1 if none
  double threshold = 0.05;
  std::vector<std::string> notes;  // missing, torn or short rank logs
};

struct StragglerOptions {
  size_t worst = 5;         // how many worst steps to keep
  double threshold = 0.05;  // a straggler step: excess > threshold x median
};

// The per-rank logs RUN_DIR/goodput/events.rank-<R>.jsonl, by rank; none when there are
// none. Unreadable files and torn lines become warnings of the returned logs.
std::vector<EventLog> read_rank_logs(const std::filesystem::path& run_dir);

// attempt_starts: (attempt, start time) of the job's attempts, to place the steps of
// ranks that did not know their attempt. Never throws on bad content.
StragglerReport compute_stragglers(const std::vector<EventLog>& rank_logs,
                                   const std::vector<std::pair<int, double>>& attempt_starts,
                                   const StragglerOptions& options = {});

}  // namespace tessera::goodput
