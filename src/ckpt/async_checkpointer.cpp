#include "tessera/ckpt/async_checkpointer.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tessera/base/error.h"

namespace fs = std::filesystem;

namespace tessera::ckpt {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// True when `staging` can hold `source` as is: same tree structure, shapes and dtypes.
bool fits(const Tree& staging, const Tree& source) {
  if (!staging.same_structure(source)) return false;
  const std::vector<Array> a = staging.leaves(), b = source.leaves();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].shape() != b[i].shape() || a[i].dtype() != b[i].dtype()) return false;
  return true;
}

Tree allocate_like(const Tree& source) {
  std::vector<Array> buffers;
  for (const Array& leaf : source.leaves()) buffers.push_back(Array::empty(leaf.shape(), leaf.dtype()));
  return source.with_leaves(buffers);
}

// Copies every leaf's bytes (raw_data() evaluates a lazy leaf first).
void copy_leaves(const Tree& source, const Tree& staging) {
  const std::vector<Array> from = source.leaves(), to = staging.leaves();
  for (size_t i = 0; i < from.size(); ++i) std::memcpy(to[i].mutable_raw_data(), from[i].raw_data(), from[i].nbytes());
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer(Writer writer, fs::path destination, AsyncCallbacks callbacks)
    : writer_(std::move(writer)), destination_(std::move(destination)), callbacks_(std::move(callbacks)) {
  if (!writer_) fail<ValueError>("AsyncCheckpointer for {}: no writer given", destination_.string());
  worker_ = std::thread([this] { worker_loop(); });
}

AsyncCheckpointer::~AsyncCheckpointer() {
  {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !busy_; });
    stopping_ = true;
    if (failure_) std::fprintf(stderr, "warning: %s\n", failure_->c_str());
  }
  cv_.notify_all();
  worker_.join();
}

void AsyncCheckpointer::rethrow_pending_locked(std::unique_lock<std::mutex>& lock) {
  if (!failure_) return;
  std::string message = std::move(*failure_);
  failure_.reset();
  lock.unlock();
  fail<IOError>("{}", message);
}

void AsyncCheckpointer::snapshot(const CheckpointState& state) {
  if (staging_allocations_ == 0 || !fits(staging_.params, state.params) || !fits(staging_.opt_state, state.opt_state)) {
    staging_.params = allocate_like(state.params);
    staging_.opt_state = allocate_like(state.opt_state);
    ++staging_allocations_;
  }
  copy_leaves(state.params, staging_.params);
  copy_leaves(state.opt_state, staging_.opt_state);
  staging_.step = state.step;
  staging_.extra = state.extra;
}

SaveTiming AsyncCheckpointer::save(const CheckpointState& state, Writer write) {
  SaveTiming timing;
  const Clock::time_point start = Clock::now();
  std::unique_lock lock(mutex_);
  rethrow_pending_locked(lock);
  cv_.wait(lock, [&] { return !busy_; });
  timing.wait_s = seconds_since(start);
  rethrow_pending_locked(lock);  // the save just waited for may have failed
  // The worker touches staging_ only while busy_, so it is ours until busy_ is set.
  const Clock::time_point copy_start = Clock::now();
  snapshot(state);
  timing.snapshot_s = seconds_since(copy_start);
  staged_writer_ = write ? std::move(write) : writer_;
  busy_ = true;
  lock.unlock();
  cv_.notify_all();
  return timing;
}

void AsyncCheckpointer::wait() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !busy_; });
  rethrow_pending_locked(lock);
}

void AsyncCheckpointer::check() {
  std::unique_lock lock(mutex_);
  if (!busy_) rethrow_pending_locked(lock);
}

bool AsyncCheckpointer::in_flight() const {
  std::lock_guard lock(mutex_);
  return busy_;
}

fs::path AsyncCheckpointer::last_committed() const {
  std::lock_guard lock(mutex_);
  return last_committed_;
}

int64_t AsyncCheckpointer::staging_allocations() const {
  std::lock_guard lock(mutex_);
  return staging_allocations_;
}

void AsyncCheckpointer::worker_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return busy_ || stopping_; });
    if (!busy_) return;  // stopping with nothing staged
    lock.unlock();
    BackgroundSave result;
    result.step = staging_.step;
    if (callbacks_.started) callbacks_.started(result.step);
    const Clock::time_point start = Clock::now();
    try {
      result.path = staged_writer_(staging_);
      result.ok = true;
    } catch (const std::exception& e) {
      result.error = fmt::format("checkpoint save of step {} to {} failed in the background: {}", result.step,
                                 destination_.string(), e.what());
    }
    result.seconds = seconds_since(start);
    std::string report_error;
    if (callbacks_.finished) {
      try {
        callbacks_.finished(result);
      } catch (const std::exception& e) {
        // A failing report (the goodput log) is an error too, but the save's outcome stands.
        report_error = fmt::format("after checkpoint step {}: {}", result.step, e.what());
      }
    }
    lock.lock();
    if (result.ok) last_committed_ = result.path;
    if (!result.ok)
      failure_ = result.error;
    else if (!report_error.empty())
      failure_ = report_error;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace tessera::ckpt
