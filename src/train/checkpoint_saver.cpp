#include "train/checkpoint_saver.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <limits>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "train/checkpoint_interval.h"

namespace fs = std::filesystem;

namespace tessera::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

CheckpointSaver::CheckpointSaver(const TrainConfig& config, goodput::Recorder* recorder, bool primary, int rank,
                                 FaultPlan faults, std::function<void(const std::string&)> note)
    : config_(config),
      recorder_(recorder),
      primary_(primary),
      rank_(rank),
      faults_(faults),
      note_(std::move(note)),
      persistent_(config.run.dir, {config.checkpoint.keep_last, config.checkpoint.keep_every}),
      last_background_s_(std::make_shared<double>(0)) {
  if (!config_.checkpoint.local_dir.empty())
    local_ = std::make_unique<ckpt::CheckpointManager>(config_.checkpoint.local_dir,
                                                       ckpt::RetentionPolicy{config_.checkpoint.local_keep_last, 0});
  // Young/Daly needs one measured save: the first comes after checkpoint.interval steps (1 when 0).
  persistent_interval_ = config_.checkpoint.auto_interval ? std::max<int64_t>(config_.checkpoint.interval, 1)
                                                          : config_.checkpoint.interval;
  if (config_.checkpoint.async && primary_) {
    ckpt::AsyncCallbacks callbacks;
    goodput::Recorder* rec = recorder_;
    std::shared_ptr<double> background_s = last_background_s_;
    callbacks.started = [rec](int64_t step) {
      if (rec) rec->checkpoint_save_start(step, goodput::SavePart::kBackground);
    };
    callbacks.finished = [rec, background_s](const ckpt::BackgroundSave& done) {
      *background_s = done.seconds;
      if (rec) rec->checkpoint_save_end(done.step, goodput::SavePart::kBackground, done.ok);
    };
    ckpt::CheckpointManager* persistent = &persistent_;
    async_ = std::make_unique<ckpt::AsyncCheckpointer>(
        [persistent](const ckpt::CheckpointState& s) { return persistent->save(s); }, persistent_.directory(),
        std::move(callbacks));
  }
}

CheckpointSaver::~CheckpointSaver() = default;

std::optional<ckpt::RestoredCheckpoint> CheckpointSaver::restore(const Tree& params_like, const Tree& opt_like,
                                                                 const std::function<void(const std::string&)>& warn) {
  std::vector<fs::path> tiers = {persistent_.directory()};
  if (local_) tiers.push_back(local_->directory());
  // Start "past every step": only the startup faults (corrupt_newest, kill@restore) are armed.
  FaultInjector startup(faults_, rank_, std::numeric_limits<int64_t>::max(), config_.run.dir);
  if (primary_) {  // the process that writes files
    const fs::path corrupted = startup.corrupt_newest(tiers);
    if (!corrupted.empty() && note_) note_(fmt::format("fault injection: corrupted {}", corrupted.string()));
  }
  return ckpt::restore_newest(tiers, params_like, opt_like, warn, startup.restore_hook());
}

void CheckpointSaver::start_at(int64_t step) {
  injector_ = std::make_unique<FaultInjector>(faults_, rank_, step, config_.run.dir);
  last_persistent_ = step;
  if (injector_->active() && note_) note_(fmt::format("fault injection armed: TESSERA_FAULT from step {}", step));
}

void CheckpointSaver::at_step_start(int64_t step) {
  if (async_) async_->check();
  if (injector_) injector_->at_step_start(step);
}

bool CheckpointSaver::persistent_due(int64_t step) const {
  if (persistent_interval_ <= 0) return false;
  if (config_.checkpoint.auto_interval) return step - last_persistent_ >= persistent_interval_;
  return step % persistent_interval_ == 0;
}

bool CheckpointSaver::local_due(int64_t step) const {
  return local_ && config_.checkpoint.local_interval > 0 && step % config_.checkpoint.local_interval == 0;
}

bool CheckpointSaver::due(int64_t step) const { return persistent_due(step) || local_due(step); }

void CheckpointSaver::save(int64_t step, const std::function<ckpt::CheckpointState()>& make_state, double step_time_s,
                           bool final) {
  const bool to_persistent = final || persistent_due(step);
  const bool to_local = local_due(step);
  if (!to_persistent && !to_local) return;
  if (to_persistent) last_persistent_ = step;
  const Clock::time_point start = Clock::now();
  if (recorder_) recorder_->checkpoint_save_start(step, goodput::SavePart::kBlocking);
  ckpt::CheckpointState state = make_state();  // every rank: gathering a sharded state is collective
  if (!primary_) return;
  const bool inject_failure = injector_ && injector_->fail_this_write(step);
  // kill@save: the SIGKILL lands in the persistent tier's write (the one a restart needs) when it has one.
  std::function<void(const fs::path&)> kill_mid_write;
  if (injector_) kill_mid_write = injector_->begin_save(step);
  ckpt::CheckpointManager* persistent = to_persistent ? &persistent_ : nullptr;
  ckpt::CheckpointManager* local = to_local ? local_.get() : nullptr;
  auto write = [persistent, local, inject_failure, kill_mid_write](const ckpt::CheckpointState& s) {
    if (inject_failure)
      fileio::fail_errno("injected fault (TESSERA_FAULT fail_write): cannot write checkpoint",
                         (persistent ? persistent : local)->directory() / fmt::format("step_{:08d}", s.step), EIO);
    fs::path committed;
    if (local)
      committed =
          local->save(s, persistent ? std::function<void(const fs::path&)>() : kill_mid_write);  // the fast tier first
    if (persistent) committed = persistent->save(s, kill_mid_write);
    return committed;
  };
  if (async_) {
    try {
      async_->save(state, write);
    } catch (...) {
      if (recorder_) recorder_->checkpoint_save_end(step, goodput::SavePart::kBlocking, /*committed=*/false);
      throw;
    }
    if (recorder_) recorder_->checkpoint_save_end(step, goodput::SavePart::kBlocking, /*committed=*/false);
  } else {
    bool committed = false;
    try {
      last_sync_checkpoint_ = write(state);
      committed = true;
    } catch (const IOError& e) {
      // A full disk (ENOSPC) or file size limit (EFBIG) surfaces here: say which save it
      // was, as the asynchronous path does; the committed checkpoints are untouched.
      if (recorder_) recorder_->checkpoint_save_end(step, goodput::SavePart::kBlocking, false);
      fail<IOError>("checkpoint save of step {} to {} failed: {}", step,
                    (persistent ? persistent : local)->directory().string(), e.what());
    } catch (...) {
      if (recorder_) recorder_->checkpoint_save_end(step, goodput::SavePart::kBlocking, false);
      throw;
    }
    if (recorder_) recorder_->checkpoint_save_end(step, goodput::SavePart::kBlocking, committed);
  }
  last_blocking_s_ = seconds_since(start);
  if (config_.checkpoint.auto_interval && to_persistent && step_time_s > 0) {
    persistent_interval_ = young_daly_interval_steps(last_blocking_s_, config_.checkpoint.mtbf_s, step_time_s);
    if (note_)
      note_(
          fmt::format("checkpoint: blocking save {:.3f} s, mtbf {:g} s, step {:.3f} s -> Young/Daly interval {} steps "
                      "(sqrt(2 C M) = {:.1f} s)",
                      last_blocking_s_, config_.checkpoint.mtbf_s, step_time_s, persistent_interval_,
                      young_daly_interval_s(last_blocking_s_, config_.checkpoint.mtbf_s)));
  }
}

void CheckpointSaver::finish() {
  if (async_) async_->wait();
}

fs::path CheckpointSaver::last_checkpoint() const {
  if (async_) return async_->last_committed();
  return last_sync_checkpoint_;
}

double CheckpointSaver::last_background_s() const { return *last_background_s_; }

}  // namespace tessera::train
