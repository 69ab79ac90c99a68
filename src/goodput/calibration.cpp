// The CPU calibration GEMM (see calibration.h).
#include "tessera/goodput/calibration.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "tessera/base/error.h"

namespace tessera::goodput {
namespace {

// c = a * b, blocked so a 64x64 tile of b stays in L1/L2 while a row of a streams;
// the inner loop is a contiguous axpy the compiler vectorizes.
void blocked_gemm(int n, const float* a, const float* b, float* c) {
  constexpr int kBlock = 64;
  std::fill(c, c + static_cast<size_t>(n) * n, 0.0f);
  for (int k0 = 0; k0 < n; k0 += kBlock)
    for (int j0 = 0; j0 < n; j0 += kBlock) {
      const int k1 = std::min(n, k0 + kBlock), j1 = std::min(n, j0 + kBlock);
      for (int i = 0; i < n; ++i) {
        float* ci = c + static_cast<size_t>(i) * n;
        for (int k = k0; k < k1; ++k) {
          const float aik = a[static_cast<size_t>(i) * n + k];
          const float* bk = b + static_cast<size_t>(k) * n;
          for (int j = j0; j < j1; ++j) ci[j] += aik * bk[j];
        }
      }
    }
}

}  // namespace

Calibration calibrate_cpu_gemm(const GemmFn& gemm, const std::string& method, int n, double min_seconds) {
  if (n <= 0 || n > 8192) fail<ValueError>("calibrate_cpu_gemm: n must be in [1, 8192] (got {})", n);
  if (!(min_seconds >= 0)) fail<ValueError>("calibrate_cpu_gemm: min_seconds must be >= 0 (got {})", min_seconds);
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<float> a(elems), b(elems), c(elems);
  for (size_t i = 0; i < elems; ++i) {
    a[i] = static_cast<float>(i % 13) * 0.01f;
    b[i] = static_cast<float>(i % 7) * 0.02f;
  }
  const GemmFn run = gemm ? gemm : GemmFn(blocked_gemm);
  using Clock = std::chrono::steady_clock;
  run(n, a.data(), b.data(), c.data());  // warm-up: page faults, thread pool start
  Calibration result;
  result.n = n;
  result.method = gemm ? method : "naive blocked gemm";
  double best = 1e300;
  const Clock::time_point begin = Clock::now();
  do {
    const Clock::time_point t0 = Clock::now();
    run(n, a.data(), b.data(), c.data());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    ++result.repeats;
  } while (std::chrono::duration<double>(Clock::now() - begin).count() < min_seconds);
  result.seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  result.peak_flops = 2.0 * n * static_cast<double>(n) * n / std::max(best, 1e-9);
  return result;
}

}  // namespace tessera::goodput
