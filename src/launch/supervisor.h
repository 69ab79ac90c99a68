// `tessera launch`: runs a job's worker processes, watches them (exits, heartbeats)
// and restarts the whole group after a failure or a hang until it succeeds or the
// restart budget is spent. Every attempt is recorded in the run's goodput log
// (RUN_DIR/goodput/events.jsonl): job_start; per attempt an attempt_start whose reason
// says why the previous one ended (the workers' own Recorder joins it through
// TESSERA_GOODPUT_ATTEMPT), a failure with the reason when it fails, the backoff as a
// launch_wait; job_end at the end.
//
// Restarts: an attempt that completed a training step (a crash after progress) is
// retried at once; only a run of attempts that fail before any step (a crash loop)
// waits, backoff_s * 2^(k-1) before the k-th of them, at most max(backoff_s, 300).
// On a hang the stuck rank is first asked for every thread's stack (SIGUSR1 to the pid
// in its heartbeat; the trainer writes them to its log, then touches
// <heartbeat file>.stacks), at most stack_dump_wait_s (none for a stopped process),
// then the group is killed at once: a hung rank cannot checkpoint and the others wait
// on it, so --grace applies only after a crash.
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
  std::string heartbeat_dir;     // empty: a temporary directory, removed at the end
  double backoff_s = 1;          // crash loops: backoff_s * 2^(k-1) before the k-th restart without progress
  double stack_dump_wait_s = 3;  // on a hang: how long the stuck rank gets to write its stacks
  double grace_s = 30;           // SIGTERM -> SIGKILL after a crash (a hang is killed at once)
  double poll_s = 0.2;
  LaunchMode mode = LaunchMode::kFork;
  // Several hosts (mode kMpirun; the seeds' "manual" multi-host mode, no scheduler):
  // nproc_per_host ranks on each host (nproc = hosts.size() * nproc_per_host), started by
  // mpirun through its remote agent: launch_agent, or OpenMPI's default (ssh) when empty.
  // The run directory (and --heartbeat-dir) must be on storage every host sees; the
  // default heartbeat directory is then a fresh one inside the run directory (also
  // under srun, whose tasks may run on other nodes).
  std::vector<std::string> hosts;
  int nproc_per_host = 1;
  std::string launch_agent;
  // A TCP job (mode kFork, no MPI, no scheduler: Kubernetes pods, hosts started by
  // hand): `nnodes` hosts each run `tessera launch` with their own node_rank; each
  // launcher starts its host's nproc workers, ranks node_rank * nproc + local, which
  // meet at `coordinator` (rank 0's host:port; TESSERA_COORDINATOR). Each launcher
  // restarts its own workers: a rank that fails makes its peers' collectives fail, so
  // every host restarts and the ranks meet again. Only node 0 writes the job's goodput
  // log; node R's launcher keeps its own in RUN_DIR/nodes/node-R/goodput/.
  std::string coordinator;
  int nnodes = 1;
  int node_rank = 0;
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
