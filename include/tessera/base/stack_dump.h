// Every thread's stack on request, for hangs: `tessera launch` sends SIGUSR1 to a rank
// that stopped making progress, and the rank writes the stack of each of its threads
// to stderr (its log) before it is killed, so a deadlock in a collective or a stuck
// read shows where every thread was.
//
// The signal lands on one thread (the leader), which walks /proc/self/task and asks
// each other thread in turn (the same signal, sent to that thread) to write its own
// frames, waiting at most half a second for each. Frames come from glibc's backtrace()
// with symbols from the dynamic symbol table (executables are linked with
// -rdynamic; C++ names print mangled: pipe the log through c++filt). Everything in the
// handler is async-signal-safe apart from backtrace(), whose first call (loading
// libgcc) is made at install time.
#pragma once

#include <string>

namespace tessera {

// Installs the handler for `signal` (e.g. SIGUSR1). After writing the stacks it creates
// `done_marker` (empty: none), which the supervisor waits for before it kills.
void install_stack_dump(int signal, const std::string& done_marker);

}  // namespace tessera
