// `tessera launch`: runs a job's worker processes, watches them (exits, heartbeats)
// and restarts the whole group after a failure or a hang until it succeeds or the
// restart budget is spent. Every attempt is recorded in the run's goodput log
// (RUN_DIR/goodput/events.jsonl): job_start; per attempt an attempt_start whose reason
// says why the previous one ended (the workers' own Recorder joins it through
// TESSERA_GOODPUT_ATTEMPT), a failure with the reason when it fails, the backoff as a
// launch_wait; job_end at the end.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/hang_detector.h"

namespace tessera::launch {

// Exit statuses a scheduler can act on.
inline constexpr int kExitOk = 0;
inline constexpr int kExitNoRetry = 2;           // a worker's usage/config error, passed through, not retried
inline constexpr int kExitBudgetExhausted = 75;  // EX_TEMPFAIL: restarts used up; requeue the job
inline constexpr int kExitCannotExecute = 127;   // the command could not be started at all
// 128 + signal: the launcher itself was stopped (SIGINT/SIGTERM), after passing the
// signal to the workers (the trainer checkpoints and stops).

enum class LaunchMode { kFork, kMpirun, kSrun };

struct LaunchOptions {
  std::vector<std::string> command;
  std::string run_dir;  // where the goodput log goes
  int nproc = 1;
  int max_restarts = 3;  // job restarts (all ranks together), not per rank
  HangPolicy hang;
  std::string heartbeat_dir;  // empty: a temporary directory, removed at the end
  double backoff_s = 1;       // before restart k (1, 2, ...): backoff_s * 2^(k-1), at most max(backoff_s, 300)
  double grace_s = 30;        // SIGTERM -> SIGKILL
  double poll_s = 0.2;
  LaunchMode mode = LaunchMode::kFork;
  std::function<void(const std::string&)> print;  // one line per event; default: stderr
};

struct AttemptOutcome {
  int attempt = 0;     // 0, 1, ... in this launch
  std::string reason;  // why it ended: "rank 1 killed by SIGKILL at step 7", "exit 3", "hang: ...", "ok"
  int exit_code = 0;
  int signal = 0;
  double seconds = 0;
  double backoff_s = 0;  // the wait before the next attempt
};

struct LaunchResult {
  int exit_code = 0;
  std::vector<AttemptOutcome> attempts;
};

LaunchResult supervise(const LaunchOptions& options);

}  // namespace tessera::launch
