// CPUID and XGETBV (cpu_isa.h). XGETBV is written as inline assembly: the intrinsic
// needs -mxsave, and this file is compiled for the baseline ISA.
#include "backend/cpu/kernels/cpu_isa.h"

#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tessera::cpu {
namespace {

X86Isa probe() {
  X86Isa isa;
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // Leaf 0: the vendor string in EBX, EDX, ECX ("Auth" "enti" "cAMD").
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) != 0)
    isa.amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 27)) == 0) {
    isa.why_no_avx512 = "the OS does not enable XSAVE (no AVX state)";
    return isa;
  }
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  // XCR0 bits 1, 2 (SSE, AVX upper halves), 5 (opmask), 6 (upper halves of zmm0-15), 7 (zmm16-31).
  constexpr uint32_t kZmmState = (1u << 1) | (1u << 2) | (1u << 5) | (1u << 6) | (1u << 7);
  const bool os_saves_zmm = (xcr0_lo & kZmmState) == kZmmState;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) {
    isa.why_no_avx512 = "the CPU has no AVX-512";
    return isa;
  }
  const unsigned max_subleaf = eax;
  // Leaf 7 EBX: 16 AVX512F, 17 DQ, 30 BW, 31 VL.
  constexpr unsigned kAvx512 = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
  if ((ebx & kAvx512) != kAvx512) {
    isa.why_no_avx512 = "the CPU has no AVX-512 (F, BW, DQ and VL)";
    return isa;
  }
  if (!os_saves_zmm) {
    isa.why_no_avx512 = "the OS does not save the AVX-512 register state (XCR0)";
    return isa;
  }
  isa.avx512 = true;
  isa.avx512_vnni = (ecx & (1u << 11)) != 0;
  if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0)
    isa.avx512_bf16 = (eax & (1u << 5)) != 0;
#else
  isa.why_no_avx512 = "not an x86-64 CPU";
#endif
  return isa;
}

}  // namespace

const X86Isa& x86_isa() {
  static const X86Isa isa = probe();
  return isa;
}

}  // namespace tessera::cpu
