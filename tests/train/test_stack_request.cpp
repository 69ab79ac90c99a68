// A request file beside the heartbeat makes the worker raise SIGUSR1 in itself once per
// request (how a supervisor on another host asks a hung rank for its stacks).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "train/stack_request.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

std::atomic<int> g_usr1{0};
void count_usr1(int) { ++g_usr1; }

bool wait_for(const std::function<bool()>& done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST(StackRequestWatcher, EachRequestFileRaisesSigusr1OnceAndIsConsumed) {
  const fs::path dir = test::fresh_test_dir("tessera_stack_request_");
  fs::create_directories(dir);
  struct sigaction counting {
  }, previous{};
  counting.sa_handler = count_usr1;
  sigemptyset(&counting.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &counting, &previous), 0);
  g_usr1 = 0;
  {
    const fs::path request = dir / "rank-0.json.stacks-request";
    StackRequestWatcher watcher(request.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * StackRequestWatcher::kPollMs));
    EXPECT_EQ(g_usr1.load(), 0) << "no request, no signal";
    for (int i = 1; i <= 2; ++i) {
      std::ofstream(request).put('\n');
      EXPECT_TRUE(wait_for([&] { return g_usr1.load() == i; }, 2.0)) << "request " << i;
      EXPECT_TRUE(wait_for([&] { return !fs::exists(request); }, 1.0)) << "the request is consumed";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * StackRequestWatcher::kPollMs));
    EXPECT_EQ(g_usr1.load(), 2) << "one signal per request";
    EXPECT_EQ(watcher.answered(), 2);
  }
  StackRequestWatcher idle("");  // no heartbeat: no thread, nothing watched
  EXPECT_EQ(idle.answered(), 0);
  sigaction(SIGUSR1, &previous, nullptr);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::train
