// Stacks on request from another host. `tessera launch` asks a hung rank on its own host
// for its stacks with SIGUSR1; a rank elsewhere (srun, multi-host mpirun) has a pid that
// means nothing there, so the supervisor creates `<heartbeat file>.stacks-request`
// beside the heartbeat (a directory every rank and the supervisor share, or the
// heartbeats themselves would not be seen). This watcher polls for that file every
// 100 ms on its own thread, which a hang in the training threads does not stop; on
// seeing it, it removes it and raises SIGUSR1 in its own process, whose handler
// (base/stack_dump.h) writes every thread's stack and touches `<heartbeat>.stacks`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace tessera::train {

class StackRequestWatcher {
 public:
  static constexpr int kPollMs = 100;

  // request: the file to watch for; empty: watches nothing (no thread).
  explicit StackRequestWatcher(std::string request);
  ~StackRequestWatcher();
  StackRequestWatcher(const StackRequestWatcher&) = delete;
  StackRequestWatcher& operator=(const StackRequestWatcher&) = delete;

  // How many requests were seen (and answered with SIGUSR1).
  int answered() const { return answered_.load(); }

 private:
  void loop();

  std::string request_;
  std::atomic<int> answered_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace tessera::train
