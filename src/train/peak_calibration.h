// The CPU peak FLOP/s that MFU divides by, measured so that neither restarts nor
// other processes distort it:
//   * quiet trials only: each timed trial of the calibration GEMM also reads how much
//     CPU the rest of the machine used meanwhile (/proc/stat minus this process); a
//     trial during which others used more than 5% of the machine is contended (it
//     would measure a low peak, so MFU would read high) and is measured again, up to
//     three trials of 0.1 s; the best quiet one is kept, or the best contended one, labelled so;
//   * cached: the result is stored per machine (CPU model and count), thread count and
//     build in TESSERA_CALIBRATION_CACHE (~/.cache/tessera/calibration.json), so a
//     restarted run starts without measuring. A contended result is used but not
//     cached. Delete the file to measure again.
#pragma once

#include <functional>
#include <string>

#include "tessera/goodput/calibration.h"
#include "tessera/train/trainer.h"

namespace tessera::train {

// CPU time the rest of the machine used during a trial, as a share of its capacity.
struct TrialLoad {
  double wall_s = 0;
  double own_cpu_s = 0;       // this process (all its threads)
  double machine_busy_s = 0;  // every CPU's non-idle time (/proc/stat)
  int cpus = 1;
  // (machine busy - own) / (wall x cpus): the share other processes took.
  double others_share() const;
  bool contended() const { return others_share() > 0.05; }
};

// Runs `work` and measures the load around it (wall, own CPU, machine busy time).
TrialLoad measure_load(const std::function<void()>& work);

// One timed trial and the load around it.
struct Trial {
  goodput::Calibration calibration;
  TrialLoad load;
};

// The cache key of this machine, thread count, build and calibration GEMM (float32's
// key names no GEMM, as before other GEMMs were calibrated).
std::string calibration_key(const CalibrationGemm& gemm = {});

// The peak: from `cache_path` when it holds this key's entry, else measured with
// `trial` (the calibration GEMM by default) as above and stored. `cache_path` empty:
// measured, not stored. A damaged cache file is measured over and rewritten.
goodput::Calibration machine_peak_flops(const std::string& cache_path, const std::function<Trial()>& trial = {},
                                        const CalibrationGemm& gemm = {});

// TESSERA_CALIBRATION_CACHE with ~/ expanded ("" when off).
std::string calibration_cache_path();

}  // namespace tessera::train
