#include "train/checkpoint_saver.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/compiler/device_program.h"
#include "train/checkpoint_interval.h"

namespace fs = std::filesystem;

namespace tessera::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Whether an interval differs enough from the last one printed (*said; 0: none yet) to
// print again: the first, then changes of over 25% (measured costs jitter by a step or two).
bool worth_saying(int64_t steps, int64_t* said) {
  if (*said > 0 && std::abs(static_cast<double>(steps - *said)) <= 0.25 * static_cast<double>(*said)) return false;
  *said = steps;
  return true;
}

// CPU seconds the calling thread has used.
double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

struct CheckpointSaver::WriteCosts {
  struct Tier {
    double blocking_s = 0;  // the blocking part of the save that wrote it
    double wall_s = 0;      // the tier's write (serialize, write, fsync, commit)
    double cpu_s = 0;       // the writing thread's CPU time for it
    int64_t writes = 0;     // finished writes (a new one since the last look: follow it)
  };
  std::mutex mutex;
  Tier local, persistent;
  int64_t local_seen = 0, persistent_seen = 0;
  // The last few writes each tier's interval follows (training thread only): their
  // median, since one save's cost jitters with what else the machine does.
  std::vector<Tier> local_recent, persistent_recent;
};

namespace {

constexpr size_t kCostHistory = 5;

// Appends `latest` (dropping the oldest beyond kCostHistory) and returns the
// component-wise median of the history.
CheckpointSaver::WriteCosts::Tier typical_write(std::vector<CheckpointSaver::WriteCosts::Tier>* recent,
                                                const CheckpointSaver::WriteCosts::Tier& latest) {
  recent->push_back(latest);
  if (recent->size() > kCostHistory) recent->erase(recent->begin());
  auto median_of = [&](double CheckpointSaver::WriteCosts::Tier::*field) {
    std::vector<double> v;
    for (const auto& t : *recent) v.push_back(t.*field);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  CheckpointSaver::WriteCosts::Tier typical = latest;
  typical.blocking_s = median_of(&CheckpointSaver::WriteCosts::Tier::blocking_s);
  typical.wall_s = median_of(&CheckpointSaver::WriteCosts::Tier::wall_s);
  typical.cpu_s = median_of(&CheckpointSaver::WriteCosts::Tier::cpu_s);
  return typical;
}

}  // namespace

CheckpointSaver::CheckpointSaver(const TrainConfig& config, goodput::Recorder* recorder, bool primary, int rank,
                                 FaultPlan faults, std::function<void(const std::string&)> note, uint64_t state_bytes,
                                 bool multi_process)
    : config_(config),
      recorder_(recorder),
      primary_(primary),
      rank_(rank),
      faults_(faults),
      note_(std::move(note)),
      persistent_(config.run.dir, {config.checkpoint.keep_last, config.checkpoint.keep_every}),
      local_tier_(resolve_local_tier(config.checkpoint, config.run.dir, state_bytes, multi_process)),
      costs_(std::make_shared<WriteCosts>()),
      last_background_s_(std::make_shared<double>(0)) {
  const CheckpointConfig& c = config_.checkpoint;
  if (!local_tier_.dir.empty())
    local_ = std::make_unique<ckpt::CheckpointManager>(local_tier_.dir, ckpt::RetentionPolicy{c.local_keep_last, 0});
  writer_steals_compute_ = c.async && !compiler::DeviceSpec::parse(config_.run.device).cuda;
  // "auto" needs measured saves: the first comes after a fixed number of steps.
  persistent_auto_ = c.interval == kAutoInterval;
  persistent_interval_ = persistent_auto_ ? kFirstAutoSaveStep : c.interval;
  local_auto_ = local_ && c.local_interval == kAutoInterval;
  local_interval_ = !local_ ? 0 : local_auto_ ? kFirstLocalSaveStep : c.local_interval;
  if (note_ && primary_) {
    const std::string persistent =
        persistent_auto_ ? fmt::format(
                               "Young/Daly sqrt(2 x save cost x mtbf {:g} s), first save at +{} steps to "
                               "measure the cost",
                               c.mtbf_s, kFirstAutoSaveStep)
        : persistent_interval_ > 0 ? fmt::format("every {} steps (checkpoint.interval)", persistent_interval_)
                                   : std::string("at the end only (checkpoint.interval = 0)");
    note_(fmt::format("checkpoints: {} {}; {}", persistent_.directory().string(), persistent, local_tier_.why));
    if (local_)
      note_(local_auto_
                ? fmt::format("checkpoints: local tier as often as costs under {:g}% of the step time, first "
                              "save at +{} steps to measure it",
                              100 * kLocalTierBudget, kFirstLocalSaveStep)
                : fmt::format("checkpoints: local tier every {} steps (checkpoint.local_interval)", local_interval_));
  }
  if (c.async && primary_) {
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
                                                                 const std::function<void(const std::string&)>& warn,
                                                                 ckpt::Placeholders placeholders) {
  std::vector<fs::path> tiers = {persistent_.directory()};
  if (local_) tiers.push_back(local_->directory());
  // Start "past every step": only the startup faults (corrupt_newest, kill@restore) are armed.
  FaultInjector startup(faults_, rank_, std::numeric_limits<int64_t>::max(), config_.run.dir);
  if (primary_) {  // the process that writes files
    const fs::path corrupted = startup.corrupt_newest(tiers);
    if (!corrupted.empty() && note_) note_(fmt::format("fault injection: corrupted {}", corrupted.string()));
  }
  auto restored = ckpt::restore_newest(tiers, params_like, opt_like, warn, startup.restore_hook(), placeholders);
  resumed_from_persistent_ = restored && restored->path.parent_path() == persistent_.directory();
  return restored;
}

void CheckpointSaver::start_at(int64_t step) {
  injector_ = std::make_unique<FaultInjector>(faults_, rank_, step, config_.run.dir);
  last_persistent_ = step;
  last_local_ = step;
  // Step 0 needs no checkpoint; a step restored from the local tier is not persisted yet.
  persistent_holds_ = step == 0 || resumed_from_persistent_ ? step : -1;
  if (injector_->active() && note_) note_(fmt::format("fault injection armed: TESSERA_FAULT from step {}", step));
}

void CheckpointSaver::at_step_start(int64_t step) {
  if (async_) async_->check();
  if (injector_) injector_->at_step_start(step);
}

bool CheckpointSaver::persistent_due(int64_t step) const {
  if (persistent_interval_ <= 0) return false;
  if (persistent_auto_) return step - last_persistent_ >= persistent_interval_;
  return step % persistent_interval_ == 0;
}

bool CheckpointSaver::local_due(int64_t step) const {
  if (!local_ || local_interval_ <= 0) return false;
  if (local_auto_) return step - last_local_ >= local_interval_;
  return step % local_interval_ == 0;
}

void CheckpointSaver::follow_costs(double step_time_s) {
  if ((!persistent_auto_ && !local_auto_) || !(step_time_s > 0)) return;
  std::lock_guard lock(costs_->mutex);
  auto cost = [&](const WriteCosts::Tier& t) { return t.blocking_s + (writer_steals_compute_ ? t.cpu_s : 0.0); };
  auto explain = [&](const WriteCosts::Tier& t) {
    return writer_steals_compute_
               ? fmt::format("{:.3f} s (blocking {:.3f} s + writer CPU {:.3f} s)", cost(t), t.blocking_s, t.cpu_s)
               : fmt::format("{:.3f} s blocking", cost(t));
  };
  if (local_auto_ && costs_->local.writes > costs_->local_seen) {
    costs_->local_seen = costs_->local.writes;
    const WriteCosts::Tier l = typical_write(&costs_->local_recent, costs_->local);
    const int64_t steps = budget_interval_steps(cost(l), async_ ? l.wall_s : 0.0, step_time_s, kLocalTierBudget);
    if (worth_saying(steps, &local_said_) && note_)
      note_(
          fmt::format("checkpoints: a local save costs {}, written in {:.3f} s (medians of the last {}); step {:.3f} "
                      "s -> local tier every {} steps (under {:g}% of the step time)",
                      explain(l), l.wall_s, costs_->local_recent.size(), step_time_s, steps, 100 * kLocalTierBudget));
    local_interval_ = steps;
  }
  if (persistent_auto_ && costs_->persistent.writes > costs_->persistent_seen) {
    costs_->persistent_seen = costs_->persistent.writes;
    const WriteCosts::Tier p = typical_write(&costs_->persistent_recent, costs_->persistent);
    // Never more often than one write takes: a save would wait for the previous one.
    const int64_t steps = std::max(young_daly_interval_steps(cost(p), config_.checkpoint.mtbf_s, step_time_s),
                                   budget_interval_steps(0, async_ ? p.wall_s : 0.0, step_time_s, 1));
    if (worth_saying(steps, &persistent_said_) && note_)
      note_(
          fmt::format("checkpoints: a persistent save costs {}, written in {:.3f} s (medians of the last {}); mtbf "
                      "{:g} s, step {:.3f} s -> Young/Daly interval {} steps (sqrt(2 C M) = {:.1f} s)",
                      explain(p), p.wall_s, costs_->persistent_recent.size(), config_.checkpoint.mtbf_s, step_time_s,
                      steps, young_daly_interval_s(cost(p), config_.checkpoint.mtbf_s)));
    persistent_interval_ = steps;
  }
}

bool CheckpointSaver::due(int64_t step, double step_time_s) {
  follow_costs(step_time_s);
  return persistent_due(step) || local_due(step);
}

void CheckpointSaver::save(int64_t step, const std::function<ckpt::CheckpointState()>& make_state, bool final) {
  const bool to_persistent = final || persistent_due(step);
  const bool to_local = local_due(step);
  if (!to_persistent && !to_local) return;
  if (to_persistent) {
    last_persistent_ = step;
    persistent_holds_ = step;
  }
  if (to_local) last_local_ = step;
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
  std::shared_ptr<WriteCosts> costs = costs_;
  auto write = [persistent, local, inject_failure, kill_mid_write, costs](const ckpt::CheckpointState& s) {
    if (inject_failure)
      fileio::fail_errno("injected fault (TESSERA_FAULT fail_write): cannot write checkpoint",
                         (persistent ? persistent : local)->directory() / fmt::format("step_{:08d}", s.step), EIO);
    // Each tier's write is timed (wall and this thread's CPU) for the "auto" intervals.
    auto timed = [&costs](WriteCosts::Tier WriteCosts::*tier, const std::function<fs::path()>& save) {
      const Clock::time_point wall = Clock::now();
      const double cpu = thread_cpu_s();
      fs::path path = save();
      std::lock_guard lock(costs->mutex);
      WriteCosts::Tier& t = (*costs).*tier;
      t.wall_s = seconds_since(wall);
      t.cpu_s = thread_cpu_s() - cpu;
      ++t.writes;
      return path;
    };
    fs::path committed;
    if (local)  // the fast tier first
      committed = timed(&WriteCosts::local, [&] {
        return local->save(s, persistent ? std::function<void(const fs::path&)>() : kill_mid_write);
      });
    if (persistent) committed = timed(&WriteCosts::persistent, [&] { return persistent->save(s, kill_mid_write); });
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
  // The write above may still be running: it counts its own `writes`, which due() waits for.
  std::lock_guard lock(costs_->mutex);
  if (to_local) costs_->local.blocking_s = last_blocking_s_;
  if (to_persistent) costs_->persistent.blocking_s = last_blocking_s_;
}

void CheckpointSaver::finish() {
  if (async_) async_->wait();
}

void CheckpointSaver::discard_local_tier() {
  if (!local_tier_.automatic || !primary_) return;
  std::error_code ec;
  fs::remove_all(local_tier_.dir, ec);
  if (ec && note_)
    note_(fmt::format("warning: could not remove the local tier {}: {}", local_tier_.dir.string(), ec.message()));
}

fs::path CheckpointSaver::last_checkpoint() const {
  if (async_) return async_->last_committed();
  return last_sync_checkpoint_;
}

double CheckpointSaver::last_background_s() const { return *last_background_s_; }

}  // namespace tessera::train
