// Every thread's stack on a signal (see stack_dump.h).
#include "tessera/base/stack_dump.h"

#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace tessera {
namespace {

constexpr int kMaxFrames = 64;
constexpr size_t kPathMax = 4096;

char g_marker[kPathMax] = {};
std::atomic<int> g_leader{0};  // tid of the thread writing the dump, 0 when none
std::atomic<int> g_target{0};  // the thread asked to write its frames now
std::atomic<int> g_acked{0};   // set by the target when done
int g_signal = 0;

pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

void put(int fd, const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(fd, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

// Decimal text of v into buf (async-signal-safe; no printf).
const char* decimal(long v, char (&buf)[24]) {
  char* p = buf + sizeof(buf) - 1;
  *p = '\0';
  const bool negative = v < 0;
  unsigned long u = negative ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do {
    *--p = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (negative) *--p = '-';
  return p;
}

// This thread's name (/proc/self/task/TID/comm), written after the header.
void put_thread_header(int fd, pid_t tid) {
  char num[24];
  put(fd, "--- thread ");
  put(fd, decimal(tid, num));
  char path[64] = "/proc/self/task/";
  std::strcat(path, decimal(tid, num));
  std::strcat(path, "/comm");
  char name[64] = {};
  if (const int comm = ::open(path, O_RDONLY | O_CLOEXEC); comm >= 0) {
    const ssize_t n = ::read(comm, name, sizeof(name) - 1);
    ::close(comm);
    if (n > 0) {
      name[n] = '\0';
      if (char* nl = std::strchr(name, '\n')) *nl = '\0';
      put(fd, " (");
      put(fd, name);
      put(fd, ")");
    }
  }
  put(fd, " ---\n");
}

void put_own_frames(int fd) {
  void* frames[kMaxFrames];
  const int n = ::backtrace(frames, kMaxFrames);
  put_thread_header(fd, this_tid());
  ::backtrace_symbols_fd(frames, n, fd);
}

void sleep_ms(long ms) {
  timespec t{0, ms * 1000000L};
  ::nanosleep(&t, nullptr);
}

// The leader: its own frames, then each other thread's, one at a time.
void dump_every_thread(int fd) {
  char num[24];
  put(fd, "=== tessera: the stacks of every thread of pid ");
  put(fd, decimal(::getpid(), num));
  put(fd, " (asked for by signal ");
  put(fd, decimal(g_signal, num));
  put(fd, "; names are mangled: c++filt) ===\n");
  put_own_frames(fd);
  const int dir = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    alignas(8) char buf[4096];
    for (;;) {
      const long n = ::syscall(SYS_getdents64, dir, buf, sizeof(buf));
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        auto* entry = reinterpret_cast<struct dirent64*>(buf + off);
        off += entry->d_reclen;
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        pid_t tid = 0;
        for (const char* c = entry->d_name; *c >= '0' && *c <= '9'; ++c) tid = tid * 10 + (*c - '0');
        if (tid == this_tid()) continue;
        g_acked.store(0);
        g_target.store(tid);
        if (::syscall(SYS_tgkill, ::getpid(), tid, g_signal) != 0) continue;
        for (int waited = 0; waited < 500 && g_acked.load() == 0; waited += 5) sleep_ms(5);
        if (g_acked.load() == 0) {
          put_thread_header(fd, tid);
          put(fd, "(did not answer within 0.5 s)\n");
        }
      }
    }
    ::close(dir);
  }
  g_target.store(0);
  put(fd, "=== tessera: end of stacks ===\n");
}

extern "C" void on_stack_dump_signal(int, siginfo_t* info, void*) {
  const int saved_errno = errno;
  const pid_t tid = this_tid();
  // tgkill from this process: a leader's request for one thread's frames. One that
  // arrives late (the thread had signals blocked, e.g. inside a GEMM, past the leader's
  // wait) is dropped rather than starting a second dump.
  const bool from_leader = info != nullptr && info->si_code == SI_TKILL && info->si_pid == ::getpid();
  if (from_leader) {
    if (g_leader.load() != 0 && g_target.load() == tid) {
      put_own_frames(STDERR_FILENO);
      g_acked.store(1);
    }
  } else {
    int none = 0;
    if (g_leader.compare_exchange_strong(none, tid)) {
      dump_every_thread(STDERR_FILENO);
      if (g_marker[0] != '\0') {
        const int marker = ::open(g_marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (marker >= 0) ::close(marker);
      }
      g_leader.store(0);
    }
  }
  errno = saved_errno;
}

}  // namespace

void install_stack_dump(int signal, const std::string& done_marker) {
  // backtrace() loads libgcc on its first call (not async-signal-safe): do it here.
  void* frames[4];
  (void)::backtrace(frames, 4);
  std::strncpy(g_marker, done_marker.c_str(), kPathMax - 1);
  g_signal = signal;
  struct sigaction action {};
  action.sa_sigaction = on_stack_dump_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_SIGINFO;
  ::sigaction(signal, &action, nullptr);
}

}  // namespace tessera
