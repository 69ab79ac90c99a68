// Recording a run's goodput events from any training loop.
//
//   tessera::goodput::Recorder rec(run_dir);       // RUN_DIR/goodput/events.jsonl, appended
//   rec.job_start("gpt2-small");                   // written once per job (skipped on restarts)
//   rec.attempt_start();                           // attempt 0, 1, ... (counted from the log)
//   { Span init(rec, Phase::kBackendInit); ... }
//   for (step...) {
//     { Span wait(rec, Phase::kDataWait); batch = loader.next(); }
//     rec.step_start(step); ...; rec.step_end(step, tokens, model_flops);
//   }
//   rec.job_end(true);
//
// One Recorder per job (rank 0 writes; every rank's own step times go to its per-rank
// log, rank_log.h, which the reader merges into straggler attribution). Every event is one write() of one line; phase
// boundaries (everything except step, data-wait and span-internal events) are also
// fsynced so a crash loses at most the steps since the last boundary. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tessera/goodput/calibration.h"
#include "tessera/goodput/devices.h"
#include "tessera/goodput/events.h"

namespace tessera::goodput {

// A checkpoint save has a blocking part (training waits: snapshot, serialization) and
// an optional background part (writing and committing while training goes on). Only
// the blocking part is badput. `committed` on an end event says the checkpoint is
// durable: its steps count as kept even if the job fails later.
enum class SavePart { kBlocking, kBackground };

struct RecorderOptions {
  std::function<double()> clock;  // unix seconds; default: std::chrono::system_clock
  bool fsync = true;              // fsync at phase boundaries (tests may turn it off)
};

class Recorder {
 public:
  // Creates RUN_DIR/goodput/ and opens events.jsonl for appending (IOError naming the
  // path if it cannot). An existing log is scanned for the job_start and the last
  // attempt number, so a restarted job continues the same log.
  explicit Recorder(const std::filesystem::path& run_dir, RecorderOptions options = {});
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  const std::filesystem::path& path() const { return path_; }
  int attempt() const;  // the current attempt number (-1 before attempt_start)
  double now() const;

  void job_start(std::string_view job_name = "");  // no-op when the log already has one
  // reason: why the previous attempt ended; default: the last failure's message in the
  // log, or "no failure recorded (killed?)".
  // When TESSERA_GOODPUT_ATTEMPT names the log's newest attempt (a supervisor such as
  // `tessera launch` opened it), this process joins that attempt and writes nothing.
  void attempt_start(std::string_view reason = "");
  void backend_init_start();
  void backend_init_end(std::string_view backend = "");
  void compile_start(std::string_view what = "");
  void compile_end(bool cache_hit);
  void checkpoint_restore_start(int64_t step);
  void checkpoint_restore_end(int64_t step);
  void checkpoint_save_start(int64_t step, SavePart part);
  void checkpoint_save_end(int64_t step, SavePart part, bool committed);
  void data_wait_start();
  void data_wait_end();
  void step_start(int64_t step);
  // model_flops: the FLOPs of this step as the compiled program counts them (all devices).
  // pipeline_bubble: the devices' idle share within the step (pipeline parallelism), or
  // a negative number (not recorded) without one.
  void step_end(int64_t step, int64_t tokens, double model_flops, double pipeline_bubble = -1);
  void eval_start();
  void eval_end();
  void failure(int signal, int exit_code, std::string_view message);
  void custom_badput_start(std::string_view type);
  void custom_badput_end(std::string_view type);
  void job_end(bool ok = true);
  void calibration(const Calibration& calibration);
  void device(const DeviceRecord& device);
  // A launcher's wait (queued, scheduling, provisioning) between start and end.
  void launch_wait(double start, double end, std::string_view launcher = "");

  // Any event: {"v","t","type","attempt"} plus fields. sync: fsync after writing.
  void record(EventType type, nlohmann::json fields = nlohmann::json::object(), bool sync = true);

 private:
  void write_line(const std::string& line, bool sync);

  std::filesystem::path path_;
  RecorderOptions options_;
  mutable std::mutex mutex_;
  int fd_ = -1;
  int attempt_ = -1;
  int last_attempt_in_log_ = -1;
  bool has_job_start_ = false;
  std::string last_failure_;
};

enum class Phase { kBackendInit, kCompile, kCheckpointRestore, kDataWait, kEval, kCustomBadput };

// Records a phase's start now and its end when destroyed (also during unwinding, so a
// throwing phase is still closed in the log).
class Span {
 public:
  // custom_type: the badput type for kCustomBadput; step: for kCheckpointRestore.
  Span(Recorder& recorder, Phase phase, std::string custom_type = {}, int64_t step = -1);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  void set_cache_hit(bool hit) { cache_hit_ = hit; }  // for kCompile

 private:
  Recorder& recorder_;
  Phase phase_;
  std::string custom_type_;
  int64_t step_;
  bool cache_hit_ = false;
};

}  // namespace tessera::goodput
