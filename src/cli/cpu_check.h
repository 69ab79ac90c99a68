// Startup check that the CPU can run the instructions the kernels were compiled for.
#pragma once

#include <string>

namespace tessera::cli {

// CPU features the running machine has, for `tessera info`.
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  // The low-precision matrix paths (CPUID leaf 7): AVX-512 foundation, VNNI int8 dot
  // products, AVX512-BF16 dot products, and the AMX tile units for bf16 and int8.
  bool avx512f = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;
};
CpuFeatures detect_cpu_features();

// Whether the kernels in this binary were compiled for AVX2+FMA+F16C.
bool kernels_need_avx2();

// Empty when this CPU can run this binary; otherwise a message saying what is
// missing and how to rebuild.
std::string cpu_mismatch_message();

}  // namespace tessera::cli
