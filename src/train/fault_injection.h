// Fault injection for resilience tests, from TESSERA_FAULT (or TrainerOptions):
//
//   kill@step=7        raise(SIGKILL) at the start of step 7 (as a node failure would)
//   hang@step=5        sleep forever at the start of step 5 (for a supervisor's hang detector)
//   corrupt_newest     at startup, flip bytes in the newest committed checkpoint's params file
//   fail_write@step=4  the first checkpoint write of step >= 4 fails with an injected EIO
//   ...,rank=1         only on process rank 1 (default: every rank)
//
// The rules that let a restarted job (same command, same TESSERA_FAULT) make progress:
//   * a step fault fires only in an attempt that started before its step (start_step < S,
//     "once S steps are done" for kill/hang), not in one resumed from a checkpoint at or after S;
//   * every fault fires once per run directory: just before it fires, a marker file
//     RUN_DIR/.fault_fired.<kind>.rank<R> is written durably, and a marked fault stays off.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::train {

struct FaultPlan {
  enum class Kind { kNone, kKill, kHang, kCorruptNewest, kFailWrite };
  Kind kind = Kind::kNone;
  int64_t step = -1;  // kill, hang, fail_write
  int rank = -1;      // -1: every rank

  // ValueError naming the spec and the bad part.
  static FaultPlan parse(std::string_view spec);
  // TESSERA_FAULT, or no fault when unset or empty.
  static FaultPlan from_env();
};

class FaultInjector {
 public:
  FaultInjector(FaultPlan plan, int rank, int64_t start_step, std::filesystem::path run_dir);

  bool active() const { return armed_; }
  // Kill or hang when `step` (the steps done so far) is the fault's step.
  void at_step_start(int64_t step);
  // True once, for the first save of a step >= the fault's step: the caller fails that write.
  bool fail_this_write(int64_t save_step);
  // corrupt_newest: flips bytes in the newest committed checkpoint of these checkpoints
  // directories (once per run directory); returns the corrupted file (empty if none).
  std::filesystem::path corrupt_newest(const std::vector<std::filesystem::path>& checkpoints_dirs);

 private:
  // Writes the marker (fsynced) and disarms: the fault fires now, and never again here.
  void mark_fired();

  FaultPlan plan_;
  std::filesystem::path marker_;
  bool armed_ = false;
};

// Flips 16 bytes in the middle of `file` (IOError if it cannot be opened or is empty).
void flip_bytes_in_middle(const std::filesystem::path& file);

}  // namespace tessera::train
