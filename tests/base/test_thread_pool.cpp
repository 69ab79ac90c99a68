// The process-wide thread pool: coverage of the range, chunking independent of the
// thread count, nesting, exceptions reaching the caller, a forked child, back-to-back
// regions with spinning and sleeping workers, and the spin setting's errors.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera {
namespace {

class ThreadCount : public ::testing::Test {
 protected:
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = num_threads();
};

std::vector<std::pair<int64_t, int64_t>> chunks_seen(int64_t n, int64_t grain) {
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> seen;
  parallel_for(n, grain, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mutex);
    seen.emplace_back(b, e);
  });
  std::sort(seen.begin(), seen.end());
  return seen;
}

TEST_F(ThreadCount, CoversTheRangeOnceInFixedChunks) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    auto seen = chunks_seen(1003, 100);
    ASSERT_EQ(seen.size(), 11u) << threads << " threads";
    for (size_t c = 0; c < seen.size(); ++c) {
      EXPECT_EQ(seen[c].first, static_cast<int64_t>(c) * 100);
      EXPECT_EQ(seen[c].second, std::min<int64_t>(1003, (static_cast<int64_t>(c) + 1) * 100));
    }
  }
  EXPECT_EQ(num_chunks(1003, 100), 11);
  EXPECT_TRUE(chunks_seen(0, 10).empty());
}

// fork() copies only the calling thread; the child must not wait for the parent's
// workers (it hung there before the pool's at-fork handler).
TEST_F(ThreadCount, AForkedChildRunsParallelRegionsOnItsOwnWorkers) {
  set_num_threads(3);
  std::atomic<int64_t> parent_total{0};
  parallel_for(1000, 10, [&](int64_t b, int64_t e) { parent_total += e - b; });  // workers started
  ASSERT_EQ(parent_total.load(), 1000);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(30);  // a hang ends the child by SIGALRM
    bool ok = num_threads() == 3;
    for (int round = 0; round < 20; ++round) {
      std::atomic<int64_t> total{0};
      parallel_for(1000, 10, [&](int64_t b, int64_t e) { total += e - b; });
      ok = ok && total.load() == 1000;
    }
    set_num_threads(2);
    std::atomic<int64_t> total{0};
    parallel_for(1000, 10, [&](int64_t b, int64_t e) { total += e - b; });
    ::_exit(ok && total.load() == 1000 && num_threads() == 2 ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " (SIGALRM, 14: it waited for the parent's workers)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a parallel region in the child covered the wrong range";
  std::atomic<int64_t> after{0};
  parallel_for(1000, 10, [&](int64_t b, int64_t e) { after += e - b; });  // the parent's pool is intact
  EXPECT_EQ(after.load(), 1000);
}

TEST_F(ThreadCount, NestedCallsRunInline) {
  set_num_threads(2);
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) parallel_for(100, 10, [&](int64_t bb, int64_t ee) { total += ee - bb; });
  });
  EXPECT_EQ(total.load(), 800);
}

TEST_F(ThreadCount, ExceptionFromAWorkerReachesTheCaller) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    try {
      parallel_for(64, 1, [](int64_t b, int64_t) {
        if (b == 37 || b == 50) fail<ValueError>("chunk {} failed", b);
      });
      FAIL() << "expected an exception";
    } catch (const ValueError& e) {
      EXPECT_STREQ(e.what(), "chunk 37 failed") << "the lowest failing chunk wins, for any thread count";
    }
    // The pool still works afterwards.
    EXPECT_EQ(chunks_seen(10, 5).size(), 2u);
  }
}

TEST_F(ThreadCount, RejectsNonPositiveSize) { EXPECT_THROW(set_num_threads(0), ValueError); }

// Sets TESSERA_POOL_SPIN_US for one test and restarts the pool so that it takes effect.
class SpinSetting : public ThreadCount {
 protected:
  void use(const char* spin_us, int threads) {
    ::setenv("TESSERA_POOL_SPIN_US", spin_us, 1);
    set_num_threads(threads == 1 ? 2 : 1);
    set_num_threads(threads);
  }
  void TearDown() override {
    for (const char* name : {"TESSERA_POOL_SPIN_US", "TESSERA_LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"})
      ::unsetenv(name);
    set_num_threads(saved_ == 1 ? 2 : 1);  // a restart reads the default again
    ThreadCount::TearDown();
  }
};

// Back-to-back regions with workers that poll (a region starts while they spin), that
// sleep (pauses between regions outlast the spin), or never spin: every region covers its
// range exactly once and returns only after all of it ran.
TEST_F(SpinSetting, BackToBackRegionsEachCoverTheirRangeOnce) {
  // 2 threads: more than the machine's CPUs would turn the polling off.
  for (const char* spin_us : {"0", "50", "1000"}) {
    use(spin_us, 2);
    for (int region = 0; region < 3000; ++region) {
      if (region % 500 == 499) ::usleep(300);  // longer than a 50 us spin: the workers sleep
      const int64_t n = 3 + region % 7;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
            << "spin " << spin_us << ", region " << region << ", item " << i;
    }
  }
}

// More threads than CPUs: a polling thread would keep the one its region waits for off
// the CPU, so nobody polls, whatever the setting (3 threads on 2 CPUs polling 20 ms took
// 6 ms a region instead of 30 us).
TEST_F(SpinSetting, MoreThreadsThanCpusDoNotPoll) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  use("20000", CPU_COUNT(&set) + 1);
  const auto start = std::chrono::steady_clock::now();
  for (int region = 0; region < 400; ++region) EXPECT_EQ(chunks_seen(12, 1).size(), 12u);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Not polling: about 20 ms on 2 CPUs; polling: about 2 s.
  EXPECT_LT(seconds, 0.5) << "400 regions took " << seconds << " s: the threads polled";
}

// Polling needs a second thread, a setting above 0, and no more threads over this host's
// processes of the job than CPUs.
TEST_F(SpinSetting, PollingFollowsTheSettingTheThreadsAndTheHostsProcesses) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int cpus = CPU_COUNT(&set);
  use("50", 1);
  EXPECT_EQ(pool_poll_microseconds(), 0) << "one thread";
  use("50", cpus + 1);
  EXPECT_EQ(pool_poll_microseconds(), 0) << "more threads than CPUs";
  if (cpus < 2) GTEST_SKIP() << "one CPU here: a pool of 2 threads never polls";
  use("50", 2);
  EXPECT_EQ(pool_poll_microseconds(), 50);
  use("0", 2);
  EXPECT_EQ(pool_poll_microseconds(), 0) << "setting 0";
  for (const char* processes : {"TESSERA_LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    ::setenv(processes, std::to_string(cpus).c_str(), 1);  // 2 threads each: twice the CPUs
    use("50", 2);
    EXPECT_EQ(pool_poll_microseconds(), 0) << processes << "=" << cpus;
    ::setenv(processes, std::to_string(cpus / 2).c_str(), 1);  // exactly the CPUs (or fewer)
    use("50", 2);
    EXPECT_EQ(pool_poll_microseconds(), 50) << processes << "=" << cpus / 2;
    ::unsetenv(processes);
  }
}

TEST_F(SpinSetting, ABadSettingIsNamedAndLeavesThePoolAsItWas) {
  use("50", 2);
  for (const char* bad : {"abc", "-1", "5us", "2000000"}) {
    ::setenv("TESSERA_POOL_SPIN_US", bad, 1);
    try {
      set_num_threads(3);
      FAIL() << "TESSERA_POOL_SPIN_US=" << bad << " was taken";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("TESSERA_POOL_SPIN_US='") + bad + "'"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("microseconds (expected an integer from 0 to 1000000)"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(num_threads(), 2);
    EXPECT_EQ(chunks_seen(100, 10).size(), 10u);
  }
}

TEST_F(SpinSetting, ABadProcessCountIsNamedAndLeavesThePoolAsItWas) {
  use("50", 2);
  ::setenv("TESSERA_LOCAL_WORLD_SIZE", "two", 1);
  try {
    set_num_threads(3);
    FAIL() << "TESSERA_LOCAL_WORLD_SIZE=two was taken";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("TESSERA_LOCAL_WORLD_SIZE='two' is not a process count"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(num_threads(), 2);
  EXPECT_EQ(chunks_seen(100, 10).size(), 10u);
}

}  // namespace
}  // namespace tessera
