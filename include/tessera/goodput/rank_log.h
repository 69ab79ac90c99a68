// Per-rank step records: every rank of a job appends its own step times to
// RUN_DIR/goodput/events.rank-<R>.jsonl, which `tessera goodput` merges to find
// stragglers (stragglers.h). The job's log (events.jsonl, recorder.h) stays one writer's.
//
//   tessera::goodput::RankRecorder ranks(run_dir, goodput::rank_from_environment(), attempt);
//   for (step...) { ... ranks.step(step, start, end, data_wait_s, collective_s); }
//
// Two event types, one JSON object per line, each line one write() (a rank dying
// mid-write tears at most its own last line, which the reader skips):
//
//   {"v":1,"t":T,"type":"rank_start","rank":1,"world_size":4,"attempt":0,"pid":P,"host":"node7"}
//   {"v":1,"t":T,"type":"rank_step","rank":1,"attempt":0,"step":12,"start":S,"end":E,
//    "data_wait_s":0.004,"collective_s":0.21}
//
// "attempt" is -1 when the rank cannot know it (not under `tessera launch`, not rank 0):
// the reader then places the step in the job's attempt that was running at its start.
// No collective and no fsync per step: the cost is one small write() per step and rank.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace tessera::fileio {
class File;
}

namespace tessera::goodput {

// Which rank of how many this process is, as the launcher said.
struct RankIdentity {
  int rank = 0;
  int world_size = 1;
};

// TESSERA_RANK / TESSERA_WORLD_SIZE (tessera launch), else OpenMPI's
// OMPI_COMM_WORLD_RANK / _SIZE, PMI_RANK / PMI_SIZE, PMIX_RANK, Slurm's SLURM_PROCID /
// SLURM_NTASKS; rank 0 of 1 without any. Values that are not numbers are ignored.
RankIdentity rank_from_environment();

// RUN_DIR/goodput/events.rank-<R>.jsonl
std::filesystem::path rank_log_path(const std::filesystem::path& run_dir, int rank);

class RankRecorder {
 public:
  // Creates RUN_DIR/goodput/ and appends a rank_start line (IOError naming the path if it
  // cannot). clock: unix seconds, for tests; default the system clock.
  RankRecorder(const std::filesystem::path& run_dir, RankIdentity identity, int attempt,
               std::function<double()> clock = {});
  ~RankRecorder();
  RankRecorder(const RankRecorder&) = delete;
  RankRecorder& operator=(const RankRecorder&) = delete;

  const std::filesystem::path& path() const { return path_; }
  int rank() const { return identity_.rank; }

  // One completed step: its wall-clock start and end (unix seconds), the part of it the
  // rank waited for data, and the part it spent inside collectives (0 without any).
  void step(int64_t step, double start, double end, double data_wait_s, double collective_s);

 private:
  void write_line(const std::string& line);

  std::filesystem::path path_;
  RankIdentity identity_;
  int attempt_;
  std::function<double()> clock_;
  std::unique_ptr<fileio::File> file_;  // opened for appending
};

}  // namespace tessera::goodput
