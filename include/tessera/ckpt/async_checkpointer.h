// Asynchronous checkpoint saves: the training loop blocks only while the state is
// copied into host staging buffers; a background thread then serializes, writes,
// fsyncs and commits it through the writer (normally CheckpointManager::save, so the
// atomic temp-dir/fsync/rename commit is the same as a synchronous save).
//
//   AsyncCheckpointer async([&](const CheckpointState& s) { return manager.save(s); }, manager.directory());
//   SaveTiming t = async.save(state);   // waits for the previous save, snapshots, returns
//   ...
//   async.wait();                       // before exiting: nothing may stay in flight
//
// At most one save is in flight: save() first waits for the previous one, and that
// wait counts as blocking time (it is badput). The staging buffers are allocated at
// the first save and reused while the state keeps its structure, shapes and dtypes
// (training never changes them), so a save allocates nothing the size of the state.
// A background failure (disk full, EIO) is stored and rethrown by the next save(),
// check() or wait() as an IOError naming the checkpoint directory and the OS error.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tessera/ckpt/checkpoint.h"

namespace tessera::ckpt {

// Where the training loop's time went in one save() call.
struct SaveTiming {
  double wait_s = 0;      // waiting for the previous save to finish
  double snapshot_s = 0;  // copying the state into the staging buffers
  double blocking_s() const { return wait_s + snapshot_s; }
};

// One background write, as reported to the callbacks (on the background thread).
struct BackgroundSave {
  int64_t step = 0;
  std::filesystem::path path;  // the committed checkpoint (empty on failure)
  double seconds = 0;          // serialize + write + fsync + commit
  bool ok = false;
  std::string error;  // the failure's message when !ok
};

struct AsyncCallbacks {
  std::function<void(int64_t step)> started;            // the background write begins
  std::function<void(const BackgroundSave&)> finished;  // ... and ends (committed or failed)
};

class AsyncCheckpointer {
 public:
  using Writer = std::function<std::filesystem::path(const CheckpointState&)>;

  // `destination` names where checkpoints go in error messages (the checkpoints directory).
  AsyncCheckpointer(Writer writer, std::filesystem::path destination, AsyncCallbacks callbacks = {});
  // Waits for the save in flight. A failure still pending then is printed to stderr,
  // not thrown: callers that care call wait() first.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Rethrows a stored failure, waits for the save in flight, copies `state` into the
  // staging buffers and hands it to the background thread, which writes it with
  // `write` (default: the constructor's writer).
  SaveTiming save(const CheckpointState& state, Writer write = {});
  // Waits until no save is in flight; rethrows a failure (once).
  void wait();
  // Rethrows a failure of a finished background save (once); never blocks.
  void check();

  bool in_flight() const;
  std::filesystem::path last_committed() const;
  // How often the staging buffers were (re)allocated: 1 after any number of saves of
  // one state structure.
  int64_t staging_allocations() const;

 private:
  void worker_loop();
  void rethrow_pending_locked(std::unique_lock<std::mutex>& lock);
  void snapshot(const CheckpointState& state);

  Writer writer_;
  std::filesystem::path destination_;
  AsyncCallbacks callbacks_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool busy_ = false;  // a staged state waits or is being written
  bool stopping_ = false;
  std::optional<std::string> failure_;  // a background error not yet rethrown
  std::filesystem::path last_committed_;

  CheckpointState staging_;  // the host copy the background thread writes (reused)
  Writer staged_writer_;
  int64_t staging_allocations_ = 0;
  std::thread worker_;  // last: started once the members above exist
};

}  // namespace tessera::ckpt
