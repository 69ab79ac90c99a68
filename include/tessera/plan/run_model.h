// From one step to a whole run: time to train on a token budget and what it costs,
// raw and goodput-adjusted (the first seed's ISO-goodput question).
//
// Failures: a job on n chips fails at n * failure_rate per hour (the catalog's rate per
// chip-hour), a mean time between failures M = 3600 / (n * rate) seconds. It saves a
// checkpoint every T = sqrt(2 C M) seconds (Young/Daly, train/checkpoint_interval.h;
// at most the run's length),
// each save blocking training for C seconds. Each failure costs the restart R plus on
// average half an interval of lost steps. To first order the share of paid time that
// becomes kept progress is
//
//     goodput = 1 / (1 + C / T + (R + T / 2) / M)
//
// and the run takes raw / goodput. Without failures (rate 0) nothing is saved or lost.
#pragma once

#include "tessera/goodput/accelerators.h"
#include "tessera/plan/step_model.h"

namespace tessera::plan {

struct RunCosts {
  // Seconds from a failure to training again: rescheduling, loading the checkpoint,
  // compiling. tessera's own resume on one host measures ~1-2 s
  // (bench/results/2026-11-26-time-to-resume.md); a large job waits for replacement
  // chips, which Meta's Llama 3 report and Google's goodput posts put at minutes.
  double restart_seconds = 600;
  // Seconds a checkpoint save blocks training (asynchronous saves: the device-to-host
  // copy only).
  double save_seconds = 10;
};

struct RunEstimate {
  double tokens = 0;
  double steps = 0;
  double raw_seconds = 0;   // steps * step time
  double mtbf_seconds = 0;  // the job's (infinite without failures)
  double checkpoint_interval_seconds = 0;
  double goodput = 1;     // runtime goodput
  double seconds = 0;     // raw / goodput
  double chip_hours = 0;  // goodput-adjusted
  double dollars_raw = 0, dollars = 0;
};

// The run of `tokens` tokens with steps of `step` on its chips of `accelerator`.
RunEstimate estimate_run(const StepEstimate& step, const goodput::AcceleratorSpec& accelerator, double tokens,
                         const RunCosts& costs = {});

}  // namespace tessera::plan
