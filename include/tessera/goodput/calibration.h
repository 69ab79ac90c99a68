// CPU peak FLOP/s for Program Goodput (MFU) on CPUs: there is no datasheet number that
// matches what a given machine sustains, so the run measures a calibration GEMM once at
// start-up and stores the result with the run (a "calibration" event). MFU on a CPU is
// therefore "fraction of the measured GEMM rate", and reports say so.
#pragma once

#include <functional>
#include <string>

namespace tessera::goodput {

// c = a * b for n x n row-major float matrices. The trainer passes its BLAS GEMM; the
// goodput library itself depends on no BLAS.
using GemmFn = std::function<void(int n, const float* a, const float* b, float* c)>;

struct Calibration {
  double peak_flops = 0;  // 2 n^3 * repeats / seconds, the best of the timed repeats
  int n = 0;
  int repeats = 0;
  double seconds = 0;  // total time spent timing
  std::string method;  // "blas gemm" (a caller's GemmFn, named by the caller) or "naive blocked gemm"
};

// Times repeated n x n GEMMs for at least min_seconds (after one warm-up call) and
// returns the fastest repeat's rate. Without gemm, a cache-blocked loop is used: it is
// far below a tuned BLAS, so MFU against it overstates what the hardware could do.
Calibration calibrate_cpu_gemm(const GemmFn& gemm = {}, const std::string& method = "caller gemm", int n = 512,
                               double min_seconds = 0.3);

}  // namespace tessera::goodput
