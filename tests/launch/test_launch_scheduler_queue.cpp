// The queue wait read from Slurm's `scontrol show job -o` (launch/scheduler_queue.h).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <ctime>
#include <string>

#include "launch/scheduler_queue.h"

namespace tessera::launch {
namespace {

// Sets TZ for one test (the times scontrol prints are local), restoring it after.
class LocalZone : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* tz = std::getenv("TZ")) saved_ = tz, had_ = true;
  }
  void TearDown() override {
    if (had_)
      ::setenv("TZ", saved_.c_str(), 1);
    else
      ::unsetenv("TZ");
    ::tzset();
  }
  void zone(const char* tz) {
    ::setenv("TZ", tz, 1);
    ::tzset();
  }
  std::string saved_;
  bool had_ = false;
};

// A line as Slurm 22.05's `scontrol show job -o` prints it (shortened).
const char* kLine =
    "JobId=4242 JobName=train UserId=root(0) GroupId=root(0) Priority=1 JobState=RUNNING Reason=None "
    "RunTime=00:00:05 TimeLimit=UNLIMITED SubmitTime=2026-11-27T10:00:00 EligibleTime=2026-11-27T10:00:00 "
    "StartTime=2026-11-27T10:02:30 EndTime=Unknown NodeList=tbh[1-2] NumNodes=2";

TEST_F(LocalZone, ReadsSubmitAndStartTimesInTheLocalZone) {
  zone("UTC");
  std::string why;
  const auto wait = parse_scontrol_job(kLine, &why);
  ASSERT_TRUE(wait) << why;
  EXPECT_EQ(wait->source, "slurm job 4242");
  EXPECT_DOUBLE_EQ(wait->started - wait->submitted, 150.0);
  EXPECT_DOUBLE_EQ(wait->submitted, 1795773600.0);  // 2026-11-27T10:00:00Z
  zone("CET-1");                                    // one hour east of UTC: the same wall clock is an hour earlier
  const auto east = parse_scontrol_job(kLine, &why);
  ASSERT_TRUE(east) << why;
  EXPECT_DOUBLE_EQ(east->submitted, 1795773600.0 - 3600.0);
}

TEST_F(LocalZone, SaysWhyWhenTheTimesAreMissingOrOutOfOrder) {
  zone("UTC");
  std::string why;
  EXPECT_FALSE(parse_scontrol_job("JobId=7 JobState=PENDING SubmitTime=2026-11-27T10:00:00 StartTime=Unknown", &why));
  EXPECT_EQ(why, "job 7: StartTime 'Unknown' is not a time (not started?)");
  EXPECT_FALSE(parse_scontrol_job("JobId=7 StartTime=2026-11-27T10:00:00", &why));
  EXPECT_EQ(why, "job 7: SubmitTime '' is not a time");
  EXPECT_FALSE(parse_scontrol_job("JobId=7 SubmitTime=2026-11-27T10:00:00 StartTime=2026-11-27T09:59:59", &why));
  EXPECT_EQ(why, "job 7: StartTime 2026-11-27T09:59:59 is before SubmitTime 2026-11-27T10:00:00");
  EXPECT_FALSE(parse_scontrol_job("slurm_load_jobs error: Invalid job id specified", &why));
  EXPECT_EQ(why, "no JobId in scontrol's output");
  EXPECT_FALSE(parse_scontrol_job("JobId=7 SubmitTime=2026-11-27T10:00:00x StartTime=2026-11-27T10:00:00", &why));
  EXPECT_EQ(why, "job 7: SubmitTime '2026-11-27T10:00:00x' is not a time");
}

TEST(SlurmQueueWait, OutsideSlurmSaysSo) {
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::string saved = job ? job : "";
  ::unsetenv("SLURM_JOB_ID");
  std::string why;
  EXPECT_FALSE(slurm_queue_wait(&why));
  EXPECT_EQ(why, "not in a Slurm job (SLURM_JOB_ID is not set)");
  ::setenv("SLURM_JOB_ID", "12; rm -rf /", 1);
  EXPECT_FALSE(slurm_queue_wait(&why));
  EXPECT_EQ(why, "SLURM_JOB_ID '12; rm -rf /' is not a job id");
  if (job)
    ::setenv("SLURM_JOB_ID", saved.c_str(), 1);
  else
    ::unsetenv("SLURM_JOB_ID");
}

}  // namespace
}  // namespace tessera::launch
