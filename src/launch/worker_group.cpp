// fork/exec, process groups and reaping for the supervisor (see worker_group.h).
#include "launch/worker_group.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tessera/base/error.h"

namespace tessera::launch {

std::string signal_name(int signal) {
  switch (signal) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return fmt::format("signal {}", signal);
  }
}

namespace {

// Runs in the child between fork and exec: only async-signal-safe calls, then the exec
// error (errno) goes back through the close-on-exec pipe.
[[noreturn]] void exec_child(const WorkerSpec& spec, char** argv, int error_fd) {
  ::setpgid(0, 0);
  for (const auto& [name, value] : spec.env) ::setenv(name.c_str(), value.c_str(), 1);
  ::execvp(argv[0], argv);
  const int error = errno;
  [[maybe_unused]] const ssize_t n = ::write(error_fd, &error, sizeof error);
  ::_exit(127);
}

}  // namespace

WorkerGroup::~WorkerGroup() {
  for (pid_t group : groups_) ::kill(-group, SIGKILL);
  for (pid_t& pid : pids_)
    if (pid > 0) {
      ::waitpid(pid, nullptr, 0);
      pid = 0;
    }
}

void WorkerGroup::start(const std::vector<WorkerSpec>& specs) {
  if (running()) fail<ValueError>("WorkerGroup::start: the previous workers still run");
  pids_.clear();
  groups_.clear();
  for (const WorkerSpec& spec : specs) {
    if (spec.argv.empty()) fail<ValueError>("WorkerGroup::start: rank {} has an empty command", pids_.size());
    std::vector<char*> argv;
    for (const std::string& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) fail<IOError>("launch: pipe failed: {}", std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      fail<IOError>("launch: fork failed for rank {}: {}", pids_.size(), std::strerror(errno));
    }
    if (pid == 0) exec_child(spec, argv.data(), pipe_fds[1]);
    ::setpgid(pid, pid);  // also here: no race with a kill before the child ran setpgid
    pids_.push_back(pid);
    groups_.push_back(pid);
    ::close(pipe_fds[1]);
    int error = 0;
    ssize_t n;
    do n = ::read(pipe_fds[0], &error, sizeof error);
    while (n < 0 && errno == EINTR);
    ::close(pipe_fds[0]);
    if (n == static_cast<ssize_t>(sizeof error)) {
      terminate(0);
      fail<IOError>("launch: cannot run '{}': {}", spec.argv[0], std::strerror(error));
    }
  }
}

std::vector<WorkerExit> WorkerGroup::poll() {
  std::vector<WorkerExit> exits;
  for (size_t rank = 0; rank < pids_.size(); ++rank) {
    if (pids_[rank] <= 0) continue;
    int status = 0;
    const pid_t done = ::waitpid(pids_[rank], &status, WNOHANG);
    if (done != pids_[rank]) continue;
    pids_[rank] = 0;
    WorkerExit e;
    e.rank = static_cast<int>(rank);
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
    exits.push_back(e);
  }
  return exits;
}

bool WorkerGroup::running() const {
  for (pid_t pid : pids_)
    if (pid > 0) return true;
  return false;
}

void WorkerGroup::signal_all(int signal) {
  for (pid_t pid : pids_)
    if (pid > 0) ::kill(-pid, signal);
}

void WorkerGroup::terminate(double grace_s) {
  signal_all(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (running() && std::chrono::steady_clock::now() < deadline) {
    poll();
    if (running()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // SIGKILL the groups of those still running and of those already reaped (their
  // children may linger), then reap.
  for (pid_t group : groups_) ::kill(-group, SIGKILL);
  for (pid_t& pid : pids_)
    if (pid > 0) {
      ::waitpid(pid, nullptr, 0);
      pid = 0;
    }
}

}  // namespace tessera::launch
