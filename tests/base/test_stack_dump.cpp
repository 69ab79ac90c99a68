// The stack dump a hung rank writes on SIGUSR1 (base/stack_dump.h): a child process
// with a second thread parked in a known function gets the signal; its stderr must
// hold both threads' frames, the parked function's name among them, and the done
// marker must appear.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "tessera/base/stack_dump.h"

namespace fs = std::filesystem;

// Not static and not inlined: -rdynamic exports them, so the dump can name them.
extern "C" [[gnu::noinline]] void tessera_stack_dump_test_parked_thread(std::atomic<bool>* ready) {
  ready->store(true);
  for (;;) ::pause();
}
extern "C" [[gnu::noinline]] void tessera_stack_dump_test_main_waits(int ready_fd) {
  const char byte = 'r';
  if (::write(ready_fd, &byte, 1) != 1) ::_exit(3);
  for (;;) ::pause();
}

TEST(StackDump, SigusrWritesEveryThreadsFramesAndTheMarker) {
  const fs::path marker = fs::temp_directory_path() / ("tessera_stack_dump_" + std::to_string(::getpid()) + ".stacks");
  fs::remove(marker);
  int out[2], ready[2];
  ASSERT_EQ(::pipe(out), 0);
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(out[1], STDERR_FILENO);
    ::close(out[0]);
    ::close(ready[0]);
    tessera::install_stack_dump(SIGUSR1, marker.string());
    static std::atomic<bool> thread_ready{false};
    std::thread parked(tessera_stack_dump_test_parked_thread, &thread_ready);
    parked.detach();
    while (!thread_ready.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    tessera_stack_dump_test_main_waits(ready[1]);
  }
  ::close(out[1]);
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_EQ(::kill(child, SIGUSR1), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fs::exists(marker) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(fs::exists(marker)) << "no done marker within 10 s";
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  ::close(ready[0]);
  fs::remove(marker);
  EXPECT_NE(text.find("=== tessera: the stacks of every thread of pid " + std::to_string(child)), std::string::npos)
      << text;
  EXPECT_NE(text.find("=== tessera: end of stacks ==="), std::string::npos) << text;
  size_t threads = 0;
  for (size_t at = text.find("--- thread "); at != std::string::npos; at = text.find("--- thread ", at + 1)) ++threads;
  EXPECT_EQ(threads, 2u) << text;
  EXPECT_NE(text.find("tessera_stack_dump_test_parked_thread"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_stack_dump_test_main_waits"), std::string::npos) << text;
  EXPECT_EQ(text.find("did not answer"), std::string::npos) << text;
}
