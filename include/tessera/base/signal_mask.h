// Code that must not be interrupted by a signal handler: oneDNN 2.x's JIT sgemm
// kernels (Debian 12 ships 2.6) point rsp into a heap buffer, so a signal frame the
// kernel writes below rsp lands in the heap and corrupts it (oneDNN issue #4845, fixed
// in oneDNN 3.12). Any signal with a handler does it: a SIGTERM preemption notice, a
// Ctrl-C, launch's SIGUSR1 for stacks, a profiler's SIGPROF. Measured on this trainer
// before the guard: 4 of 6 runs with five SIGUSR1s (a handler that does nothing) died
// with "corrupted size vs. prev_size".
#pragma once

#include <signal.h>

namespace tessera {

// Blocks every asynchronous signal on this thread while it lives (the synchronous
// ones, SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGTRAP/SIGABRT/SIGSYS, stay open); one pending
// for the thread runs when the scope ends, and one sent to the process goes to a
// thread that does not block it. Two rt_sigprocmask calls: well under a microsecond.
class AsyncSignalsBlocked {
 public:
  AsyncSignalsBlocked();
  ~AsyncSignalsBlocked();
  AsyncSignalsBlocked(const AsyncSignalsBlocked&) = delete;
  AsyncSignalsBlocked& operator=(const AsyncSignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

}  // namespace tessera
