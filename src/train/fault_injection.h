// Fault injection for resilience tests, from TESSERA_FAULT (or TrainerOptions): a list
// of faults separated by ';', each one of
//
//   kill@step=7        raise(SIGKILL) at the start of step 7 (as a node failure would)
//   term@step=7        raise(SIGTERM) at the start of step 7 (a preemption notice that
//                      reaches this rank alone: every rank must still stop together)
//   hang@step=5        sleep forever at the start of step 5 (for a supervisor's hang detector)
//   slow@step=5,ms=300 sleep 300 ms at the start of step 5, then go on (a straggler for the
//                      per-rank goodput records; the step is recorded as step 6)
//   kill@save=2        SIGKILL in the middle of this process's 2nd checkpoint write: after its
//                      params file is written, before its manifest and the commit (rename);
//                      on the writer thread for an asynchronous save
//   kill@restore=1     SIGKILL in the middle of the run directory's 1st restore (counted over
//                      restarts): the checkpoint was read and verified, its tensors not loaded
//   corrupt_newest     at startup, flip bytes in the newest committed checkpoint's params file
//   fail_write@step=4  the first checkpoint write of step >= 4 fails with an injected EIO
//   ...,rank=1         only on process rank 1 (default: every rank): the MPI rank, else the
//                      launcher's (TESSERA_RANK, SLURM_PROCID) for workers without MPI
//
// e.g. TESSERA_FAULT="kill@step=5;kill@save=2;kill@restore=1;corrupt_newest".
//
// The rules that let a restarted job (same command, same TESSERA_FAULT) make progress
// through the list:
//   * a step fault fires only in an attempt that started before its step (start_step < S,
//     "once S steps are done" for kill/hang), not in one resumed from a checkpoint at or after S;
//   * every fault fires once per run directory: just before it fires, a marker file
//     RUN_DIR/.fault_fired.<index>.<item>.rank<R> is written durably (index: its place in
//     the list, item: its text), and a marked fault stays off.
// kill@save and corrupt_newest fire on the process that writes checkpoints (rank 0);
// kill@restore on any rank (each counts its own restores).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::train {

struct Fault {
  enum class Kind { kKill, kTerm, kHang, kSlow, kCorruptNewest, kFailWrite, kKillInSave, kKillInRestore };
  Kind kind = Kind::kKill;
  int64_t at = -1;   // the step (kill, hang, slow, fail_write) or the save / restore count (from 1)
  int rank = -1;     // -1: every rank
  int64_t ms = -1;   // slow: the delay in milliseconds
  size_t index = 0;  // its place in the list, from 0
  std::string text;  // the item as written ("kill@save=2,rank=0")
};

struct FaultPlan {
  std::vector<Fault> faults;

  // ValueError naming the spec, the bad item and the accepted grammar.
  static FaultPlan parse(std::string_view spec);
  // TESSERA_FAULT, or no fault when unset or empty.
  static FaultPlan from_env();
  bool empty() const { return faults.empty(); }
};

class FaultInjector {
 public:
  // Arms the faults of `plan` for process `rank` in an attempt that starts at `start_step`.
  FaultInjector(FaultPlan plan, int rank, int64_t start_step, std::filesystem::path run_dir);

  // Whether some fault may still fire in this process.
  bool active() const;
  // Kill, hang or sleep when `step` (the steps done so far) is a fault's step.
  void at_step_start(int64_t step);
  // True once, for the first save of a step >= the fault's step: the caller fails that write.
  bool fail_this_write(int64_t save_step);
  // corrupt_newest: flips bytes in the newest committed checkpoint of these checkpoints
  // directories (once per run directory); returns the corrupted file (empty if none).
  std::filesystem::path corrupt_newest(const std::vector<std::filesystem::path>& checkpoints_dirs);
  // Counts one checkpoint write of this process. For the one a kill@save fault names,
  // returns what the writer calls once part of the checkpoint is on disk (it SIGKILLs
  // the process; safe on the writer thread); otherwise an empty function.
  std::function<void(const std::filesystem::path& partial)> begin_save(int64_t save_step);
  // What a restore calls once it has read and verified a checkpoint, before loading it:
  // counts the run directory's restores (RUN_DIR/.fault_restores.rank<R>, fsynced) and
  // SIGKILLs the process on the one a kill@restore fault names.
  std::function<void(const std::filesystem::path& checkpoint)> restore_hook();

 private:
  struct Armed {
    Fault fault;
    std::filesystem::path marker;
    bool armed = false;
  };
  // Writes the marker (fsynced) and disarms: the fault fires now, and never again here.
  static void mark_fired(Armed& armed);

  int rank_;
  std::filesystem::path run_dir_;
  std::vector<Armed> faults_;
  int64_t saves_ = 0;  // checkpoint writes begun by this process
};

// Flips 16 bytes in the middle of `file` (IOError if it cannot be opened or is empty).
void flip_bytes_in_middle(const std::filesystem::path& file);

}  // namespace tessera::train
