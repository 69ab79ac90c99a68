// The training job behind `tessera train`: prepares data if needed, builds the model
// and optimizer, resumes from the newest valid checkpoint in the run directory, runs
// the compiled step with a live progress line, validates, checkpoints, writes
// metrics.jsonl and records goodput events, and reports what the run achieved.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "tessera/backend/cuda.h"
#include "tessera/core/tree.h"
#include "tessera/goodput/calibration.h"
#include "tessera/goodput/devices.h"
#include "tessera/train/config.h"

namespace tessera::goodput {
class Recorder;
}

namespace tessera::train {

struct TrainSummary {
  int64_t start_step = 0;  // > 0 when resumed
  int64_t end_step = 0;
  std::string stop_reason;   // "steps", "time limit"
  double train_seconds = 0;  // this attempt's training loop (steps, evals, checkpoints)
  double tokens_per_s = 0;   // over this attempt's steps (median step time)
  double mfu = 0;            // model FLOP/s over peak_flops
  double peak_flops = 0;     // the job's peak: the calibration GEMM (CPU) or the device table (GPU)
  std::string peak_source;   // where peak_flops came from, for reports
  double last_loss = 0;
  std::optional<double> val_loss;
  std::filesystem::path last_checkpoint;
  int64_t parameters = 0;
  // The optimizer and the bytes of its state (moments, factors, step: all devices'
  // together), for comparing optimizers' memory (AdamW: 8 bytes per float32 parameter).
  std::string optimizer;
  uint64_t optimizer_state_bytes = 0;
  std::string goodput_table;  // where the run's time went (goodput/report.h), "" if not recorded
  // SPMD runs (parallel.mesh): the mesh, the collectives of one step and their bytes
  // per device, the peak memory of one device; "" on one device.
  std::string parallel_summary;
  // int8 training ([quant]): which matmuls run in int8 and their share of the step's
  // matmul FLOPs, the int8 GEMM path; "" without int8.
  std::string quant_summary;
  // Pipeline parallelism (a `pipeline` mesh axis): the median over the attempt's steps of
  // the devices' measured idle share within a step (the bubble), and the schedule's
  // analytic value for equal stages.
  std::optional<double> pipeline_bubble, pipeline_bubble_analytic;
};

struct TrainerOptions {
  bool progress = true;        // live progress line on stderr
  bool record_goodput = true;  // RUN_DIR/goodput/events.jsonl
  // Stop after this optimizer step (with a checkpoint), as if the job were preempted
  // there; 0: run to train.steps. The schedule still spans train.steps, so a resumed
  // run continues exactly where a straight one would be.
  int64_t stop_at_step = 0;
  // Called after every optimizer step with the step number (user hooks, tests).
  std::function<void(int64_t step)> after_step;
};

class Trainer {
 public:
  explicit Trainer(TrainConfig config, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains until train.steps, the time limit, stop_at_step, or SIGINT/SIGTERM (the
  // current step finishes and a checkpoint is saved first). May be called once.
  TrainSummary run();

  // State after run() (tests compare resumed and straight runs bitwise).
  const Tree& params() const;
  const Tree& opt_state() const;
  const TrainConfig& config() const;

 private:
  TrainSummary run_attempt(goodput::Recorder* recorder);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Makes sure config.data.train and .val exist: prepares them from data.sources (or
// data.fallback_sources) when missing. Returns a note of what it did ("" if nothing).
std::string ensure_data(const DataConfig& data);

// The GEMM a CPU peak is calibrated with: tessera's matmul in `dtype` (the model's
// compute dtype: float32, bfloat16 or float16, each on the kernel path training takes),
// or with `int8` its AQT int8 GEMM on `dtype` operands (quantization included).
struct CalibrationGemm {
  DType dtype = DType::Float32;
  bool int8 = false;
  std::string name() const;  // "float32", "bfloat16", "int8 (AQT, bfloat16 operands)"
};

// FLOP/s of that GEMM (the faster of 1024^3 and 1536^3) on this machine with the current thread count, timed for
// about `seconds`: the CPU's practical peak, which MFU is measured against (stated as
// such in every report).
goodput::Calibration calibrate_peak_flops(double seconds = 0.4, const CalibrationGemm& gemm = {});

// The peak MFU counts against on a CUDA device: the entry of configs/accelerators.toml
// (compiled in) that matches its name, else the runtime's estimate from SMs and clock,
// labelled as such.
goodput::DeviceRecord cuda_device_peak(const cuda::DeviceInfo& info);

}  // namespace tessera::train
