// The trainer's checkpointing policy in one place: which tiers a step saves to,
// synchronous or asynchronous writes (checkpoint.async), the goodput events of each
// save, restoring the newest valid checkpoint of both tiers, and the injected faults
// of TESSERA_FAULT (train/fault_injection.h).
//
// The tiers and their intervals (both printed at the start, and again when they change):
// - persistent (RUN_DIR/checkpoints): checkpoint.interval steps, or "auto" (the default):
//   Young/Daly from the measured cost of its saves and checkpoint.mtbf_s;
// - local (train/local_tier.h, on by default): checkpoint.local_interval steps, or "auto":
//   as often as keeps its measured cost under kLocalTierBudget of the training time.
// A save's cost is its blocking time, plus, for an asynchronous write on a CPU run, the
// writer thread's CPU time (it takes a core from the training threads).
//
// Goodput: the blocking part of a save is the wait for the previous save plus the
// snapshot (async) or the whole write (sync); an async write is a background part,
// committed when it is durable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tessera/ckpt/async_checkpointer.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/tiered_restore.h"
#include "tessera/goodput/recorder.h"
#include "tessera/train/config.h"
#include "train/fault_injection.h"
#include "train/local_tier.h"

namespace tessera::train {

class CheckpointSaver {
 public:
  // primary: this process writes (the others only take part in gathering the state).
  // note: progress messages (the chosen interval, injected faults).
  // state_bytes: one checkpoint's size (sizes the local tier); multi_process: the job has
  // several processes (no automatic local tier).
  CheckpointSaver(const TrainConfig& config, goodput::Recorder* recorder, bool primary, int rank, FaultPlan faults,
                  std::function<void(const std::string&)> note, uint64_t state_bytes, bool multi_process);
  ~CheckpointSaver();

  // corrupt_newest (if injected), then the newest checkpoint that verifies in either
  // tier (kill@restore, if injected, fires once it verified, before it is loaded).
  // `placeholders`: as ckpt::CheckpointManager::load's (kNotHeld: a pipeline process
  // reads only the leaves it holds).
  std::optional<ckpt::RestoredCheckpoint> restore(const Tree& params_like, const Tree& opt_like,
                                                  const std::function<void(const std::string&)>& warn,
                                                  ckpt::Placeholders placeholders = ckpt::Placeholders::kStructure);
  // Arms the step and save faults against the step the attempt starts from.
  void start_at(int64_t step);

  // At the top of every step: rethrows a background save's failure, then the step faults.
  void at_step_start(int64_t step);
  // Whether `step` is due for a save in any tier. Folds in the costs of finished saves
  // first: "auto" intervals follow them (step_time_s: the recent step time).
  bool due(int64_t step, double step_time_s);
  // Whether the persistent tier holds `step` (saved, or the step this attempt resumed from).
  bool persisted(int64_t step) const { return persistent_holds_ == step; }
  // Saves to the due tiers (the persistent one too when `final`); make_state runs on every
  // rank. Its costs reach the "auto" intervals through due().
  void save(int64_t step, const std::function<ckpt::CheckpointState()>& make_state, bool final = false);
  // Waits for the save in flight and rethrows its failure: before returning from a run.
  void finish();
  // After a run that ended with its last step in the persistent tier: removes an
  // automatic local tier's directory (its checkpoints are older or the same).
  void discard_local_tier();
  const std::filesystem::path& local_dir() const { return local_tier_.dir; }
  int64_t local_interval() const { return local_interval_; }
  // The newest committed checkpoint (either tier); empty when none yet.
  std::filesystem::path last_checkpoint() const;
  int64_t persistent_interval() const { return persistent_interval_; }
  // The blocking and background seconds of the last save (background: async only,
  // known once it finished).
  double last_blocking_s() const { return last_blocking_s_; }
  double last_background_s() const;

 public:
  // What the background writes measured, per tier; filled by the writer, read by due().
  struct WriteCosts;

 private:
  bool persistent_due(int64_t step) const;
  bool local_due(int64_t step) const;
  void follow_costs(double step_time_s);

  const TrainConfig& config_;
  goodput::Recorder* recorder_;
  bool primary_;
  int rank_;
  FaultPlan faults_;
  std::function<void(const std::string&)> note_;
  ckpt::CheckpointManager persistent_;
  LocalTier local_tier_;
  std::unique_ptr<ckpt::CheckpointManager> local_;
  std::unique_ptr<FaultInjector> injector_;
  bool persistent_auto_ = false;
  bool local_auto_ = false;
  bool writer_steals_compute_ = false;  // async writes on a CPU run
  int64_t persistent_interval_ = 0;     // 0: only at the end
  int64_t local_interval_ = 0;
  int64_t last_persistent_ = 0;    // the step the persistent interval counts from
  int64_t persistent_holds_ = -1;  // the newest step the persistent tier holds (-1: unknown)
  int64_t last_local_ = 0;
  int64_t local_said_ = 0, persistent_said_ = 0;  // the intervals last printed
  bool resumed_from_persistent_ = false;
  std::shared_ptr<WriteCosts> costs_;
  std::filesystem::path last_sync_checkpoint_;
  double last_blocking_s_ = 0;
  std::shared_ptr<double> last_background_s_;       // written by the background thread's callback
  std::unique_ptr<ckpt::AsyncCheckpointer> async_;  // last: destroyed (waited for) first
};

}  // namespace tessera::train
