// Signals during GEMMs: a child process multiplies matrices big enough for oneDNN's
// JIT sgemm while a thread sends it a handled signal every 50 microseconds. Without the
// guard of base/signal_mask.h the signal frames land in the heap (oneDNN 2.x points rsp
// there) and the child dies of heap corruption; with it the child finishes, and every
// product equals the first one bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cpu/kernels/matmul.h"

namespace tessera::cpu {
namespace {

std::atomic<long> g_handled{0};
extern "C" void count_signal(int) { g_handled.fetch_add(1, std::memory_order_relaxed); }

// The child's work: exit 0 when every product matched and signals were handled.
[[noreturn]] void multiply_under_signals() {
  struct sigaction action {};
  action.sa_handler = count_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &action, nullptr);
  // The shapes of a small GPT's step (rows 2048, width 256, MLP 1024), both
  // transposes: forward, and the two backward products.
  std::vector<MatmulShape> shapes;
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{2048, 1024, 256},
                                {2048, 256, 1024},
                                {256, 1024, 2048},
                                {1024, 256, 2048},
                                {2048, 768, 256}})
    for (int t = 0; t < 4; ++t) {
      MatmulShape s;
      s.m = m, s.n = n, s.k = k, s.trans_a = (t & 1) != 0, s.trans_b = (t & 2) != 0;
      shapes.push_back(s);
    }
  std::vector<float> a(2048 * 2048), b(2048 * 2048);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 13) * 0.25f - 1.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 7) * 0.5f - 1.0f;
  std::vector<std::vector<float>> first;
  for (const MatmulShape& s : shapes) {
    first.emplace_back(static_cast<size_t>(s.m * s.n));
    matmul(DType::Float32, s, a.data(), b.data(), first.back().data());
  }
  std::atomic<bool> done{false};
  const pid_t worker = static_cast<pid_t>(::syscall(SYS_gettid));  // the thread running the GEMMs
  std::thread sender([&] {
    while (!done.load()) {
      ::syscall(SYS_tgkill, ::getpid(), worker, SIGUSR2);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  bool same = true;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
  for (size_t i = 0; std::chrono::steady_clock::now() < end; i = (i + 1) % shapes.size()) {
    std::vector<float> c(first[i].size());  // the heap stays busy
    matmul(DType::Float32, shapes[i], a.data(), b.data(), c.data());
    same = same && std::memcmp(c.data(), first[i].data(), c.size() * sizeof(float)) == 0;
  }
  done.store(true);
  sender.join();
  ::_exit(same && g_handled.load() > 100 ? 0 : 3);
}

TEST(MatmulSignals, HandledSignalsDuringGemmsCorruptNothing) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) multiply_under_signals();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " (heap corruption: a signal frame landed inside a GEMM kernel)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: a product changed, or fewer than 100 signals were handled";
}

}  // namespace
}  // namespace tessera::cpu
