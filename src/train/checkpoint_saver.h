// The trainer's checkpointing policy in one place: which tiers a step saves to (the
// persistent run directory every checkpoint.interval steps, or the Young/Daly interval
// with checkpoint.auto_interval; the local tier every checkpoint.local_interval),
// synchronous or asynchronous writes (checkpoint.async), the goodput events of each
// save, restoring the newest valid checkpoint of both tiers, and the injected faults
// of TESSERA_FAULT (train/fault_injection.h).
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

namespace tessera::train {

class CheckpointSaver {
 public:
  // primary: this process writes (the others only take part in gathering the state).
  // note: progress messages (the chosen interval, injected faults).
  CheckpointSaver(const TrainConfig& config, goodput::Recorder* recorder, bool primary, int rank, FaultPlan faults,
                  std::function<void(const std::string&)> note);
  ~CheckpointSaver();

  // corrupt_newest (if injected), then the newest checkpoint that verifies in either
  // tier (kill@restore, if injected, fires once it verified, before it is loaded).
  std::optional<ckpt::RestoredCheckpoint> restore(const Tree& params_like, const Tree& opt_like,
                                                  const std::function<void(const std::string&)>& warn);
  // Arms the step and save faults against the step the attempt starts from.
  void start_at(int64_t step);

  // At the top of every step: rethrows a background save's failure, then the step faults.
  void at_step_start(int64_t step);
  // Whether `step` is due for a save in any tier.
  bool due(int64_t step) const;
  // Whether the persistent tier holds `step` (saved, or the step this attempt resumed from).
  bool persisted(int64_t step) const { return last_persistent_ == step; }
  // Saves to the due tiers (the persistent one too when `final`); make_state runs on every
  // rank. step_time_s (the recent step time) feeds the Young/Daly interval.
  void save(int64_t step, const std::function<ckpt::CheckpointState()>& make_state, double step_time_s,
            bool final = false);
  // Waits for the save in flight and rethrows its failure: before returning from a run.
  void finish();

  // The newest committed checkpoint (either tier); empty when none yet.
  std::filesystem::path last_checkpoint() const;
  int64_t persistent_interval() const { return persistent_interval_; }
  // The blocking and background seconds of the last save (background: async only,
  // known once it finished).
  double last_blocking_s() const { return last_blocking_s_; }
  double last_background_s() const;

 private:
  bool persistent_due(int64_t step) const;
  bool local_due(int64_t step) const;

  const TrainConfig& config_;
  goodput::Recorder* recorder_;
  bool primary_;
  int rank_;
  FaultPlan faults_;
  std::function<void(const std::string&)> note_;
  ckpt::CheckpointManager persistent_;
  std::unique_ptr<ckpt::CheckpointManager> local_;
  std::unique_ptr<FaultInjector> injector_;
  int64_t persistent_interval_ = 0;  // 0: only at the end
  int64_t last_persistent_ = 0;
  std::filesystem::path last_sync_checkpoint_;
  double last_blocking_s_ = 0;
  std::shared_ptr<double> last_background_s_;       // written by the background thread's callback
  std::unique_ptr<ckpt::AsyncCheckpointer> async_;  // last: destroyed (waited for) first
};

}  // namespace tessera::train
