// Per-rank step records and their merge into straggler attribution: synthetic runs
// whose ranks write their logs with RankRecorder (explicit times), read back by
// report_for_run as `tessera goodput RUN_DIR` does.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "goodput/log_builder.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/rank_log.h"
#include "tessera/goodput/report.h"
#include "tessera/goodput/stragglers.h"

namespace tessera::goodput {
namespace {

namespace fs = std::filesystem;
using testing::LogBuilder;

class StragglerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera_stragglers_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "goodput");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The job's log (rank 0's view): one attempt from t=100, `steps` steps of 1 s.
  void write_job_log(int steps) {
    LogBuilder log;
    log.event(100, "job_start", {{"job", "stragglers"}});
    log.attempt(100, 0);
    for (int s = 1; s <= steps; ++s) log.step(s, 100 + s, 101 + s);
    log.event(102 + steps, "job_end", {{"status", "ok"}});
    std::ofstream(event_log_path(dir_)) << log.text();
  }

  // Rank `rank` of `world` records steps 1..steps, each 1 s plus extra[step] seconds.
  void write_rank(int rank, int world, int steps, const std::map<int, double>& extra = {}, int attempt = 0,
                  const std::map<int, double>& collective = {}) {
    RankRecorder rec(dir_, {rank, world}, attempt, [] { return 100.0; });
    for (int s = 1; s <= steps; ++s) {
      const double start = 100 + s;
      const double seconds = 1.0 + (extra.count(s) ? extra.at(s) : 0.0);
      rec.step(s, start, start + seconds, 0.01, collective.count(s) ? collective.at(s) : 0.0);
    }
  }

  fs::path dir_;
};

TEST_F(StragglerTest, TheInjectedStragglerIsNamedWithItsStepsAndSeconds) {
  write_job_log(8);
  // Rank 2 of 4 is slow on steps 3 (+0.5 s) and 7 (+0.3 s); elsewhere all ranks tie.
  for (int rank = 0; rank < 4; ++rank)
    write_rank(rank, 4, 8, rank == 2 ? std::map<int, double>{{3, 0.5}, {7, 0.3}} : std::map<int, double>{});
  const GoodputReport r = report_for_run(dir_);
  const StragglerReport& st = r.stragglers;
  ASSERT_TRUE(st.present);
  EXPECT_EQ(st.world_size, 4);
  ASSERT_EQ(st.ranks.size(), 4u);
  EXPECT_EQ(st.steps.size(), 8u);
  EXPECT_EQ(st.slowest_rank, 2);
  // median of {1, 1, 1, 1.5} is 1: the excess is the whole delay.
  EXPECT_NEAR(st.lost_s, 0.8, 1e-9);
  EXPECT_EQ(st.straggler_steps, 2);
  EXPECT_EQ(st.ranks[2].slowest_count, 2);
  EXPECT_NEAR(st.ranks[2].lost_s, 0.8, 1e-9);
  for (int rank : {0, 1, 3}) EXPECT_EQ(st.ranks[rank].slowest_count, 0) << rank;
  ASSERT_GE(st.worst.size(), 2u);
  EXPECT_EQ(st.worst[0].step, 3);
  EXPECT_EQ(st.worst[0].slowest_rank, 2);
  EXPECT_NEAR(st.worst[0].excess_s(), 0.5, 1e-9);
  EXPECT_NEAR(st.worst[0].slowest_s, 1.5, 1e-9);
  EXPECT_NEAR(st.worst[0].fastest_s, 1.0, 1e-9);
  EXPECT_EQ(st.worst[1].step, 7);
  EXPECT_NEAR(st.worst[1].excess_s(), 0.3, 1e-9);
  EXPECT_TRUE(st.notes.empty()) << st.notes.front();

  const std::string text = format_table(r);
  EXPECT_NE(text.find("stragglers: 4 ranks recorded, 8 steps compared; 0.800 s lost"), std::string::npos) << text;
  EXPECT_NE(text.find("slowest rank overall: rank 2 (slowest in 2 of 8 steps, 0.800 s charged)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("worst step 3: rank 2 took 1.500 s, median 1.000 s, fastest 1.000 s: +0.500 s"),
            std::string::npos)
      << text;
  const nlohmann::json j = report_to_json(r)["stragglers"];
  EXPECT_EQ(j["slowest_rank"], 2);
  EXPECT_NEAR(j["lost_s"].get<double>(), 0.8, 1e-9);
  EXPECT_EQ(j["steps"].size(), 8u);
  EXPECT_EQ(j["worst"][0]["step"], 3);
  EXPECT_EQ(j["ranks"][2]["slowest_count"], 2);

  // The job's goodput means what it meant: the per-rank logs add attribution, no time.
  const GoodputReport job_only = compute_goodput(read_event_log(event_log_path(dir_)));
  EXPECT_EQ(r.goodput, job_only.goodput);
  EXPECT_EQ(r.seconds, job_only.seconds);
  EXPECT_EQ(r.kept_steps, 8);
}

TEST_F(StragglerTest, TimeWaitingInCollectivesIsNotOwnTime) {
  write_job_log(4);
  // Synchronous training: every rank's step lasts 1.4 s on step 2, but ranks 0, 1 and 3
  // spent 0.4 s of it waiting in the all-reduce for rank 2.
  for (int rank = 0; rank < 4; ++rank)
    write_rank(rank, 4, 4, {{2, 0.4}}, 0, rank == 2 ? std::map<int, double>{} : std::map<int, double>{{2, 0.4}});
  const StragglerReport st = report_for_run(dir_).stragglers;
  EXPECT_EQ(st.slowest_rank, 2);
  ASSERT_FALSE(st.worst.empty());
  EXPECT_EQ(st.worst[0].step, 2);
  EXPECT_NEAR(st.worst[0].excess_s(), 0.4, 1e-9);
  EXPECT_NEAR(st.ranks[0].collective_s, 0.4, 1e-9);
}

TEST_F(StragglerTest, TornShortAndMissingRankLogsGiveNotesNotACrash) {
  write_job_log(6);
  write_rank(0, 4, 6);
  write_rank(1, 4, 4, {{2, 0.2}});  // died after step 4...
  {
    std::ofstream torn(rank_log_path(dir_, 1), std::ios::app);
    torn << R"({"v":1,"t":105.5,"type":"rank_step","rank":1,"step":5,"sta)";  // ...mid-write
  }
  write_rank(2, 4, 6);
  // Rank 3 never wrote a log; a stray file with no valid line sits beside the others.
  std::ofstream(dir_ / "goodput" / "events.rank-7.jsonl") << "not json\n";
  const GoodputReport r = report_for_run(dir_);
  const StragglerReport& st = r.stragglers;
  EXPECT_EQ(st.steps.size(), 6u);  // steps 5 and 6 compare ranks 0 and 2
  EXPECT_EQ(st.slowest_rank, 1);
  std::string notes;
  for (const std::string& n : st.notes) notes += n + "\n";
  EXPECT_NE(notes.find("events.rank-1.jsonl:6: last line is torn"), std::string::npos) << notes;
  EXPECT_NE(notes.find("rank 1: its records of attempt 0 end at step 4 while other ranks reached step 6"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find("left no per-rank log"), std::string::npos) << notes;
  EXPECT_NE(notes.find("ranks 3, 4, 5, 6"), std::string::npos) << notes;  // rank 7's file names a world of 8
  EXPECT_NE(notes.find("rank 7: its log"), std::string::npos) << notes;
  EXPECT_NE(format_table(r).find("note: "), std::string::npos);

  // A rank that restarts after such a crash starts its own line.
  RankRecorder again(dir_, {1, 4}, 1, [] { return 200.0; });
  again.step(5, 200, 201, 0, 0);
  const EventLog log = read_event_log(rank_log_path(dir_, 1));
  EXPECT_EQ(log.events.back().integer("step"), 5);
  EXPECT_EQ(log.events.back().integer("attempt"), 1);
}

TEST_F(StragglerTest, StepsOfRanksThatDidNotKnowTheirAttemptArePlacedByTime) {
  // Attempt 0 from t=100 ran steps 1-3; attempt 1 from t=110 resumed at step 2.
  std::vector<EventLog> logs;
  for (int rank = 0; rank < 2; ++rank) {
    LogBuilder log;
    log.event(100, "rank_start", {{"rank", rank}, {"world_size", 2}, {"attempt", -1}});
    for (int s = 1; s <= 3; ++s)
      log.event(101 + s, "rank_step",
                {{"rank", rank}, {"attempt", -1}, {"step", s}, {"start", 100 + s}, {"end", 101 + s}});
    for (int s = 2; s <= 4; ++s) {
      const double slow = rank == 1 && s == 2 ? 0.25 : 0.0;
      log.event(111 + s, "rank_step",
                {{"rank", rank}, {"attempt", -1}, {"step", s}, {"start", 110 + s}, {"end", 111 + s + slow}});
    }
    logs.push_back(parse_event_log(log.text(), "rank-" + std::to_string(rank)));
  }
  const StragglerReport st = compute_stragglers(logs, {{0, 100.0}, {1, 110.0}});
  ASSERT_EQ(st.steps.size(), 6u);  // (0,1) (0,2) (0,3) (1,2) (1,3) (1,4)
  EXPECT_EQ(st.steps[3].attempt, 1);
  EXPECT_EQ(st.steps[3].step, 2);
  EXPECT_EQ(st.worst[0].attempt, 1);
  EXPECT_EQ(st.worst[0].step, 2);
  EXPECT_EQ(st.worst[0].slowest_rank, 1);
  EXPECT_NEAR(st.worst[0].excess_s(), 0.125, 1e-9);  // the median of two is their mean
  EXPECT_NE(format_stragglers(st).find("step 2 (attempt 1): rank 1"), std::string::npos) << format_stragglers(st);
}

TEST_F(StragglerTest, OneRankOrNoneIsNoAttribution) {
  write_job_log(3);
  EXPECT_FALSE(report_for_run(dir_).stragglers.present);
  EXPECT_EQ(format_stragglers(report_for_run(dir_).stragglers), "");
  write_rank(0, 1, 3);
  const StragglerReport st = report_for_run(dir_).stragglers;
  EXPECT_TRUE(st.present);
  EXPECT_TRUE(st.steps.empty());
  EXPECT_EQ(st.slowest_rank, -1);
  ASSERT_EQ(st.notes.size(), 1u);
  EXPECT_NE(st.notes[0].find("1 rank only"), std::string::npos) << st.notes[0];
  EXPECT_EQ(format_stragglers(st), "") << "a one-process job's table has no straggler section";
}

TEST(RankIdentity, ComesFromTheLaunchersEnvironment) {
  const char* names[] = {
      "TESSERA_RANK", "TESSERA_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
      "PMI_SIZE",     "PMIX_RANK",          "SLURM_PROCID",         "SLURM_NTASKS"};
  std::map<std::string, std::string> saved;
  for (const char* n : names)
    if (const char* v = std::getenv(n)) saved[n] = v;
  for (const char* n : names) ::unsetenv(n);
  EXPECT_EQ(rank_from_environment().rank, 0);
  EXPECT_EQ(rank_from_environment().world_size, 1);
  ::setenv("SLURM_PROCID", "3", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  EXPECT_EQ(rank_from_environment().rank, 3);
  EXPECT_EQ(rank_from_environment().world_size, 8);
  ::setenv("TESSERA_RANK", "1", 1);  // the launcher's word wins
  ::setenv("TESSERA_WORLD_SIZE", "2", 1);
  EXPECT_EQ(rank_from_environment().rank, 1);
  EXPECT_EQ(rank_from_environment().world_size, 2);
  ::setenv("TESSERA_RANK", "one", 1);  // not a number: the next source
  EXPECT_EQ(rank_from_environment().rank, 3);
  for (const char* n : names) ::unsetenv(n);
  for (const auto& [n, v] : saved) ::setenv(n.c_str(), v.c_str(), 1);
}

}  // namespace
}  // namespace tessera::goodput
