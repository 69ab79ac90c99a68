// The processes of one attempt: each started with fork/exec in its own process group
// (so a kill reaches whatever it started too: a shell's children, mpirun's local ranks),
// reaped without blocking, and stopped together with SIGTERM and, after a grace
// period, SIGKILL.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace tessera::launch {

struct WorkerSpec {
  std::vector<std::string> argv;                         // argv[0] is looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;  // set on top of the launcher's environment
};

struct WorkerExit {
  int rank = 0;
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal killed it (then exit_code is 0)
  bool ok() const { return signal == 0 && exit_code == 0; }
};

// "SIGKILL", "SIGSEGV", ... or "signal N".
std::string signal_name(int signal);

class WorkerGroup {
 public:
  WorkerGroup() = default;
  ~WorkerGroup();  // kills (SIGKILL) and reaps whatever still runs
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts one process per spec (rank = index). A program that cannot be executed is an
  // IOError naming it, after the ones already started were killed.
  void start(const std::vector<WorkerSpec>& specs);
  // The workers that ended since the last call (never blocks).
  std::vector<WorkerExit> poll();
  bool running() const;
  // Sends `signal` to every running worker's process group.
  void signal_all(int signal);
  // SIGTERM to every running worker, up to grace_s seconds for them to end, then
  // SIGKILL; returns when all are reaped.
  void terminate(double grace_s);

 private:
  std::vector<pid_t> pids_;    // 0 once reaped
  std::vector<pid_t> groups_;  // each worker's process group (its children may outlive it)
};

}  // namespace tessera::launch
