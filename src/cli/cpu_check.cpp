// This file is compiled without -mavx2 (see CMakeLists.txt), so the check itself
// runs on any x86-64 CPU; TESSERA_KERNELS_AVX2 says what the kernels were built for.
#include "cli/cpu_check.h"

#include <fmt/format.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#ifndef TESSERA_KERNELS_AVX2
#define TESSERA_KERNELS_AVX2 0
#endif

namespace tessera::cli {

CpuFeatures detect_cpu_features() {
  CpuFeatures features;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  features.avx2 = __builtin_cpu_supports("avx2");
  features.fma = __builtin_cpu_supports("fma");
  // CPUID leaf 1, ECX bit 29, which __builtin_cpu_supports("f16c") reads too: clang
  // before 16 does not know that name.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  features.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0) {
    features.avx512f = (ebx & (1u << 16)) != 0;
    features.avx512_vnni = (ecx & (1u << 11)) != 0;
    features.amx_bf16 = (edx & (1u << 22)) != 0;
    features.amx_int8 = (edx & (1u << 25)) != 0;
    const unsigned max_subleaf = eax;
    if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0)
      features.avx512_bf16 = (eax & (1u << 5)) != 0;
  }
#endif
  return features;
}

bool kernels_need_avx2() { return TESSERA_KERNELS_AVX2 != 0; }

std::string cpu_mismatch_message() {
  if (!kernels_need_avx2()) return {};
  const CpuFeatures features = detect_cpu_features();
  if (features.avx2 && features.fma && features.f16c) return {};
  std::string missing;
  for (const auto& [name, present] :
       {std::pair{"avx2", features.avx2}, {"fma", features.fma}, {"f16c", features.f16c}}) {
    if (!present) missing += missing.empty() ? name : fmt::format(", {}", name);
  }
  return fmt::format(
      "tessera: this binary was compiled for AVX2+FMA+F16C (x86-64-v3), but this CPU lacks {}.\n"
      "Rebuild without it: cmake -S . -B build -DTESSERA_AVX2=OFF && cmake --build build",
      missing);
}

}  // namespace tessera::cli
