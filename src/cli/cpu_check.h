// Startup check that the CPU can run the instructions the kernels were compiled for.
#pragma once

#include <string>

namespace tessera::cli {

// CPU features the running machine has, for `tessera info`.
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
};
CpuFeatures detect_cpu_features();

// Whether the kernels in this binary were compiled for AVX2+FMA+F16C.
bool kernels_need_avx2();

// Empty when this CPU can run this binary; otherwise a message saying what is
// missing and how to rebuild.
std::string cpu_mismatch_message();

}  // namespace tessera::cli
