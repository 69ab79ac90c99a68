// Which AVX-512 extensions the kernels may run on this machine: the CPU must have them
// (CPUID) and the OS must save the registers they use across context switches (XGETBV:
// the opmask and all 32 zmm registers). Kernels compiled with target attributes
// (matmul_avx512bf16.cpp, matmul_int8*.cpp) run only after this said yes. AMX needs one
// more step, asking Linux for the tile state: matmul_amx.cpp, matmul_int8.cpp.
#pragma once

namespace tessera::cpu {

struct X86Isa {
  bool avx512 = false;       // AVX-512 F, BW, DQ, VL with the OS saving the zmm and opmask state
  bool avx512_bf16 = false;  // and AVX512-BF16 (VDPBF16PS)
  bool avx512_vnni = false;  // and AVX512-VNNI (VPDPBUSD)
  // CPUID vendor "AuthenticAMD". Zen 4 issues VDPBF16PS at the float32 FMA's rate (one
  // zmm per cycle each, measured), so its bf16 GEMMs run at twice sgemm's peak; the Intel
  // Xeon measured issues it at half the FMA rate (bench/results/2026-11-27-avx512-gemms.md).
  bool amd = false;
  const char* why_no_avx512 = "";
};

// Read once.
const X86Isa& x86_isa();

}  // namespace tessera::cpu
