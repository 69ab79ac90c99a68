// A worker's heartbeat for `tessera launch`: after every completed step the trainer
// calls beat(step), which (at most every kMinInterval) replaces the file named by
// TESSERA_HEARTBEAT_FILE with one line
//
//   {"step":7,"phase":"step","time":1718000000.25,"pid":1234,"host":"node-3"}
//
// written to a temporary file and renamed over the old one, so the supervisor never
// reads a torn line. Entering another phase (startup, restore, compile, eval, save)
// writes at once, with the worker's estimate of the phase's length when it has one
// ("expect_s"), so the supervisor's hang limits follow the phase
// (launch/hang_detector.h): a long evaluation is not a hang, a stuck step is. A "{rank}" in the path is replaced by the
// process's rank (TESSERA_RANK, or the rank mpirun/srun give it), so one path serves a whole job. Without
// TESSERA_HEARTBEAT_FILE beat() does nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::train {

class Heartbeat {
 public:
  static constexpr std::chrono::milliseconds kMinInterval{200};

  // Reads TESSERA_HEARTBEAT_FILE (and the rank variables) from the environment.
  static Heartbeat from_environment();
  explicit Heartbeat(std::string path);

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // Records that `step` steps are done (phase "step"). Throttled to one write per
  // kMinInterval while stepping; the first beat after another phase is written at once,
  // so the step after an eval or save runs under the step limit, not the phase's. A
  // failed write is reported once on stderr and never stops training: the heartbeat is
  // advice for the supervisor.
  void beat(int64_t step);
  // Records that the worker enters `phase` after `step` steps; `expect_s`: how long it
  // should take (negative: unknown).
  void enter(std::string_view phase, int64_t step, double expect_s = -1);

 private:
  void write(std::string_view phase, int64_t step, double expect_s);

  std::string path_;
  std::string host_json_;  // this host's name as a JSON string: the supervisor signals only its own host's pids
  std::chrono::steady_clock::time_point last_write_{};
  bool wrote_ = false;
  bool stepping_ = false;  // the last write was a "step" beat
  bool warned_ = false;
};

}  // namespace tessera::train
