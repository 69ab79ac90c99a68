// tessera launch's supervisor against a fake worker (tests/launch/fake_worker.sh) that
// heartbeats and then succeeds, exits, is SIGKILLed or hangs, per attempt.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "launch/supervisor.h"
#include "tessera/base/error.h"
#include "tessera/goodput/events.h"
#include "tessera/goodput/recorder.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::launch;

namespace {

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera_launch_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ::setenv("FAKE_PIDS", (dir_ / "pids.txt").c_str(), 1);
    ::unsetenv("FAKE_RANK");
  }
  void TearDown() override {
    ::unsetenv("FAKE_PLAN");
    ::unsetenv("FAKE_PIDS");
    ::unsetenv("FAKE_RANK");
    ::unsetenv("FAKE_BEAT_TIME");
    ::unsetenv("FAKE_ENV");
    ::unsetenv("FAKE_HOST");
    ::unsetenv("FAKE_ASKED");
    fs::remove_all(dir_);
  }
  LaunchOptions options(const std::string& plan, int max_restarts) {
    ::setenv("FAKE_PLAN", plan.c_str(), 1);
    LaunchOptions o;
    o.command = {"bash", (fs::path(TESSERA_SOURCE_DIR) / "tests/launch/fake_worker.sh").string()};
    o.run_dir = (dir_ / "run").string();
    o.max_restarts = max_restarts;
    o.backoff_s = 0;
    o.grace_s = 2;
    o.poll_s = 0.05;
    o.print = [this](const std::string& line) { lines_.push_back(line); };
    return o;
  }
  std::vector<goodput::Event> events_of(goodput::EventType type) const {
    std::vector<goodput::Event> out;
    for (const goodput::Event& e : goodput::read_event_log(goodput::event_log_path(dir_ / "run")).events)
      if (e.type == type) out.push_back(e);
    return out;
  }
  std::vector<pid_t> worker_pids() const {
    std::ifstream in(dir_ / "pids.txt");
    std::vector<pid_t> pids;
    for (pid_t pid; in >> pid;) pids.push_back(pid);
    return pids;
  }

  fs::path dir_;
  std::vector<std::string> lines_;
};

TEST_F(SupervisorTest, SucceedsAfterTwoFailuresWithinTheBudget) {
  const LaunchResult r = supervise(options("exit1 kill ok", 3));
  EXPECT_EQ(r.exit_code, kExitOk);
  ASSERT_EQ(r.attempts.size(), 3u);
  EXPECT_EQ(r.attempts[0].reason, "rank 0 exit 1 at step 3");
  EXPECT_EQ(r.attempts[1].reason, "rank 0 killed by SIGKILL at step 3");
  EXPECT_EQ(r.attempts[1].signal, SIGKILL);
  EXPECT_EQ(r.attempts[2].reason, "ok");
  // The goodput log: one attempt_start per attempt, the reason of each restart, a
  // failure per failed attempt and a successful job_end.
  const auto starts = events_of(goodput::EventType::kAttemptStart);
  ASSERT_EQ(starts.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(starts[static_cast<size_t>(i)].attempt, i);
  EXPECT_EQ(starts[1].text("reason"), "rank 0 exit 1 at step 3");
  EXPECT_EQ(starts[2].text("reason"), "rank 0 killed by SIGKILL at step 3");
  const auto failures = events_of(goodput::EventType::kFailure);
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].integer("exit_code"), 1);
  EXPECT_EQ(failures[1].integer("signal"), SIGKILL);
  EXPECT_EQ(failures[1].attempt, 1);
  ASSERT_EQ(events_of(goodput::EventType::kJobStart).size(), 1u);
  const auto ends = events_of(goodput::EventType::kJobEnd);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].text("status"), "ok");
  EXPECT_TRUE(lines_.back().find("succeeded after 3 attempt(s) (2 restart(s))") != std::string::npos) << lines_.back();
}

TEST_F(SupervisorTest, ExhaustedBudgetExits75WithEveryAttemptRecorded) {
  LaunchOptions o = options("early3", 2);
  o.backoff_s = 0.05;  // a crash loop (no step): 0.05 then 0.1, recorded as launcher waits
  const LaunchResult r = supervise(o);
  EXPECT_EQ(r.exit_code, kExitBudgetExhausted);
  EXPECT_EQ(kExitBudgetExhausted, 75);
  ASSERT_EQ(r.attempts.size(), 3u);
  EXPECT_DOUBLE_EQ(r.attempts[0].backoff_s, 0.05);
  EXPECT_DOUBLE_EQ(r.attempts[1].backoff_s, 0.1);
  EXPECT_EQ(events_of(goodput::EventType::kAttemptStart).size(), 3u);
  EXPECT_EQ(events_of(goodput::EventType::kFailure).size(), 3u);
  const auto waits = events_of(goodput::EventType::kLaunchWait);
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_GE(waits[1].number("end") - waits[1].number("start"), 0.09);
  const auto ends = events_of(goodput::EventType::kJobEnd);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].text("status"), "failed");
}

// After an attempt that made progress the restart is immediate and the crash-loop count
// starts again; attempts that fail before any step back off exponentially.
TEST_F(SupervisorTest, BackoffResetsAfterAnAttemptThatMadeProgress) {
  LaunchOptions o = options("early1 early1 exit1 early1 ok", 5);
  o.backoff_s = 0.05;
  const LaunchResult r = supervise(o);
  EXPECT_EQ(r.exit_code, kExitOk);
  ASSERT_EQ(r.attempts.size(), 5u);
  EXPECT_DOUBLE_EQ(r.attempts[0].backoff_s, 0.05);  // no step: crash loop 1
  EXPECT_DOUBLE_EQ(r.attempts[1].backoff_s, 0.1);   // crash loop 2
  EXPECT_DOUBLE_EQ(r.attempts[2].backoff_s, 0);     // steps 1..3 done, then exit 1: at once
  EXPECT_DOUBLE_EQ(r.attempts[3].backoff_s, 0.05);  // the count started again
  EXPECT_EQ(events_of(goodput::EventType::kLaunchWait).size(), 3u);
  bool said = false;
  for (const std::string& line : lines_)
    said = said || line.find("restarting in 0.0 s (it made progress") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST_F(SupervisorTest, HangIsDetectedWithinTimeoutPlusPollAndRecovered) {
  LaunchOptions o = options("hang ok", 1);
  o.hang.timeout_s = 1.0;
  ::setenv("FAKE_ASKED", (dir_ / "asked.txt").c_str(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  const LaunchResult r = supervise(o);
  EXPECT_EQ(r.exit_code, kExitOk);
  ASSERT_EQ(r.attempts.size(), 2u);
  EXPECT_EQ(r.attempts[0].reason, "hang: no step progress for 1 s (rank 0 stuck after step 3)");
  // Start-up and three 0.05 s steps, then 1 s without progress and at most one poll.
  EXPECT_GT(r.attempts[0].seconds, 1.0);
  EXPECT_LT(r.attempts[0].seconds, 1.0 + 0.05 + 0.8);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  for (pid_t pid : worker_pids()) EXPECT_NE(::kill(pid, 0), 0) << "worker " << pid << " still runs";
  // The stuck rank was asked for its stacks first, and answered (the fake's SIGUSR1 trap).
  bool asked = false;
  for (const std::string& line : lines_)
    asked = asked || (line.find("rank 0: pid ") != std::string::npos &&
                      line.find("wrote its threads' stacks to its log") != std::string::npos);
  EXPECT_TRUE(asked) << "no stack request in the launcher's lines";
  std::ifstream how(dir_ / "asked.txt");
  std::string way;
  how >> way;
  EXPECT_EQ(way, "signal") << "a rank on this host is asked with SIGUSR1";
}

// A hung rank on another host (srun, multi-host mpirun) has a pid that means nothing
// here: it is asked by a request file beside its heartbeat, never by a signal.
TEST_F(SupervisorTest, AHungRankOnAnotherHostIsAskedForStacksByFileNotSignal) {
  LaunchOptions o = options("hang ok", 1);
  o.hang.timeout_s = 1.0;
  ::setenv("FAKE_HOST", "another-host.example", 1);
  ::setenv("FAKE_ASKED", (dir_ / "asked.txt").c_str(), 1);
  const LaunchResult r = supervise(o);
  EXPECT_EQ(r.exit_code, kExitOk);
  std::ifstream in(dir_ / "asked.txt");
  std::string how, more;
  in >> how;
  EXPECT_EQ(how, "file");
  EXPECT_FALSE(in >> more) << "asked twice: " << more;
  bool answered = false;
  for (const std::string& line : lines_)
    answered = answered || line.find("on another-host.example wrote its threads' stacks") != std::string::npos;
  EXPECT_TRUE(answered) << "no answered stack request in the launcher's lines";
}

// A SIGSTOPped rank (how failure_run.sh injects a hang) cannot write stacks, is not
// waited for, and the group is killed at once instead of after --grace (SIGTERM does
// nothing to a stopped process).
TEST_F(SupervisorTest, AStoppedRankIsKilledAtOnceWithoutTheGrace) {
  LaunchOptions o = options("stop ok", 1);
  o.hang.timeout_s = 1.0;
  o.grace_s = 10;
  const LaunchResult r = supervise(o);
  EXPECT_EQ(r.exit_code, kExitOk);
  ASSERT_EQ(r.attempts.size(), 2u);
  EXPECT_EQ(r.attempts[0].reason, "hang: no step progress for 1 s (rank 0 stuck after step 3)");
  bool said = false;
  for (const std::string& line : lines_) said = said || line.find("is stopped (SIGSTOP)") != std::string::npos;
  EXPECT_TRUE(said) << "the launcher did not say the rank was stopped";
  // Detected within the timeout and a poll; not the 3 s stack wait, not the 10 s grace.
  const auto failures = events_of(goodput::EventType::kFailure);
  const auto starts = events_of(goodput::EventType::kAttemptStart);
  ASSERT_EQ(failures.size(), 1u);
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_LT(starts[1].t - failures[0].t, 1.0) << "the group was not killed at once";
  EXPECT_LT(r.attempts[0].seconds, 1.0 + 0.2 + 1.0);
  for (pid_t pid : worker_pids()) EXPECT_NE(::kill(pid, 0), 0) << "worker " << pid << " still runs";
}

// A heartbeat whose time is not a number (a foreign or damaged file) still gives its
// step; the supervisor does not stop on a JSON type error.
TEST_F(SupervisorTest, HeartbeatWithAWrongTypedTimeIsStillRead) {
  LaunchOptions o = options("kill ok", 1);
  ::setenv("FAKE_BEAT_TIME", "\"soon\"", 1);
  const LaunchResult r = supervise(o);
  EXPECT_EQ(r.exit_code, kExitOk);
  ASSERT_EQ(r.attempts.size(), 2u);
  EXPECT_NE(r.attempts[0].reason.find("SIGKILL at step 3"), std::string::npos) << r.attempts[0].reason;
}

TEST_F(SupervisorTest, ARankCrashStopsTheOtherRanks) {
  ::setenv("FAKE_RANK", "1", 1);
  LaunchOptions o = options("kill ok", 1);
  o.nproc = 3;
  const LaunchResult r = supervise(o);
  EXPECT_EQ(r.exit_code, kExitOk);
  ASSERT_EQ(r.attempts.size(), 2u);
  EXPECT_EQ(r.attempts[0].reason, "rank 1 killed by SIGKILL at step 3");
  const std::vector<pid_t> pids = worker_pids();
  EXPECT_EQ(pids.size(), 6u);  // 3 ranks x 2 attempts
  for (pid_t pid : pids) EXPECT_NE(::kill(pid, 0), 0) << "worker " << pid << " still runs";
}

// Each rank records its own steps into the job's run directory (goodput/rank_log.h),
// whatever directory its command trains in: the launcher names it. It also learns its
// rank on the host and how many workers share the host (their thread pools' polling).
TEST_F(SupervisorTest, EveryRankIsToldItsRankAndTheJobsGoodputDirectory) {
  ::setenv("FAKE_ENV", (dir_ / "env.txt").c_str(), 1);
  LaunchOptions o = options("ok", 0);
  o.nproc = 2;
  ASSERT_EQ(supervise(o).exit_code, kExitOk);
  std::ifstream in(dir_ / "env.txt");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  const std::string dir = fs::absolute(dir_ / "run").string();
  EXPECT_EQ(lines, (std::vector<std::string>{"0 2 0 2 " + dir, "1 2 1 2 " + dir}));
}

TEST_F(SupervisorTest, ExitTwoIsAConfigErrorAndNotRetried) {
  const LaunchResult r = supervise(options("exit2 ok", 3));
  EXPECT_EQ(r.exit_code, kExitNoRetry);
  ASSERT_EQ(r.attempts.size(), 1u);
  EXPECT_EQ(r.attempts[0].reason, "rank 0 exit 2 at step 3");
  EXPECT_EQ(events_of(goodput::EventType::kAttemptStart).size(), 1u);
}

TEST_F(SupervisorTest, ACommandThatCannotRunIsNotRetried) {
  LaunchOptions o = options("ok", 3);
  o.command = {(dir_ / "no-such-program").string()};
  const LaunchResult r = supervise(o);
  EXPECT_EQ(r.exit_code, kExitCannotExecute);
  ASSERT_EQ(r.attempts.size(), 1u);
  EXPECT_NE(r.attempts[0].reason.find("no-such-program"), std::string::npos) << r.attempts[0].reason;
}

TEST_F(SupervisorTest, BadOptionsAreClearErrors) {
  LaunchOptions o = options("ok", 3);
  o.nproc = 0;
  EXPECT_THROW(
      {
        try {
          supervise(o);
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("--nproc 0"), std::string::npos) << e.what();
          throw;
        }
      },
      ValueError);
  o = options("ok", 3);
  o.run_dir.clear();
  EXPECT_THROW(supervise(o), ValueError);
  o = options("ok", 3);
  o.mode = LaunchMode::kSrun;
  ::unsetenv("SLURM_JOB_ID");
  EXPECT_THROW(supervise(o), ValueError);
}

// A worker's own Recorder joins the attempt the supervisor opened instead of adding one.
TEST_F(SupervisorTest, WorkerRecorderJoinsTheSupervisorsAttempt) {
  const fs::path run = dir_ / "run";
  goodput::RecorderOptions quiet;
  quiet.fsync = false;
  goodput::Recorder launcher(run, quiet);
  launcher.job_start("launch");
  launcher.attempt_start("first");
  ::setenv("TESSERA_GOODPUT_ATTEMPT", "0", 1);
  {
    goodput::Recorder worker(run, quiet);
    worker.attempt_start();
    EXPECT_EQ(worker.attempt(), 0);
  }
  ::setenv("TESSERA_GOODPUT_ATTEMPT", "7", 1);  // not the log's newest attempt: a new one
  {
    goodput::Recorder worker(run, quiet);
    worker.attempt_start();
    EXPECT_EQ(worker.attempt(), 1);
  }
  ::unsetenv("TESSERA_GOODPUT_ATTEMPT");
  EXPECT_EQ(events_of(goodput::EventType::kAttemptStart).size(), 2u);
}

}  // namespace
