// The report `tessera info` prints (and `tessera.info()` in Python): version, threads,
// BLAS, CPU features, devices, MPI, CUDA. The first thing to paste into a bug report.
#include "cli/info_text.h"

#include <fmt/format.h>

#include "backend/cpu/kernels/attention_avx512bf16.h"
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_int8.h"
#include "cli/cpu_check.h"
#include "tessera/backend/cuda.h"
#include "tessera/base/thread_pool.h"
#include "tessera/base/version.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/trainer.h"

#if __has_include(<cblas.h>)
#include <cblas.h>
#endif

#ifndef TESSERA_HAS_MPI
#define TESSERA_HAS_MPI 0
#endif
#ifndef TESSERA_HAS_CUDA
#define TESSERA_HAS_CUDA 0
#endif

namespace tessera::cli {
namespace {

std::string blas_description() {
#if defined(OPENBLAS_VERSION)
  // openblas_get_config() reports version, build options, core type and thread limit.
  return openblas_get_config();
#else
  return "BLAS (vendor unknown: not OpenBLAS)";
#endif
}

const char* yes_no(bool value) { return value ? "yes" : "no"; }

}  // namespace

std::string info_text() {
  std::string out;
  const CpuFeatures cpu = detect_cpu_features();
  out += fmt::format("tessera {}\n", version());
  const int poll_us = pool_poll_microseconds();
  out += fmt::format("  threads        {} ({})\n", num_threads(),
                     poll_us > 0 ? fmt::format("they poll {} us between parallel regions", poll_us)
                                 : std::string("they sleep between parallel regions"));
  out += fmt::format("  BLAS           {}\n", blas_description());
  out += fmt::format(
      "  CPU features   avx2={} fma={} f16c={} avx512f={} avx512_vnni={} avx512_bf16={} amx_bf16={} amx_int8={}\n",
      yes_no(cpu.avx2), yes_no(cpu.fma), yes_no(cpu.f16c), yes_no(cpu.avx512f), yes_no(cpu.avx512_vnni),
      yes_no(cpu.avx512_bf16), yes_no(cpu.amx_bf16), yes_no(cpu.amx_int8));
  out += fmt::format("  bf16 GEMM      {}\n", cpu::bf16_gemm_path().description);
  out +=
      fmt::format("  bf16 attention {}\n", cpu::attention_bf16_native()
                                               ? "tile GEMMs on AVX512-BF16 (bf16 operands, P and dS rounded to bf16)"
                                               : "tiles widened to float32");
  out += fmt::format("  int8 GEMM      {}\n", cpu::int8_gemm_path().description);
  out += fmt::format("  kernels built  {}\n", kernels_need_avx2() ? "AVX2+FMA+F16C (x86-64-v3)" : "generic (no AVX2)");
  out += fmt::format("  devices        {} (TESSERA_CPU_DEVICES=N for N virtual devices; mpirun for one per process)\n",
                     spmd::runtime_description());
  out += fmt::format("  MPI            {}\n",
                     TESSERA_HAS_MPI ? "yes (mpirun -n N runs one device per rank)" : "no (not built)");
  if (!TESSERA_HAS_CUDA) {
    out += fmt::format("  CUDA           no (CPU-only build)\n");
  } else if (!cuda::available()) {
    out += fmt::format("  CUDA           built, but {}\n", cuda::unavailable_reason());
  } else {
    for (int d = 0; d < cuda::device_count(); ++d) {
      const cuda::DeviceInfo info = cuda::device_info(d);
      const goodput::DeviceRecord peak = train::cuda_device_peak(info);
      out += fmt::format(
          "  GPU {}          {} (sm_{}{}, {} SMs, {:.1f} GiB, driver {}.{}, runtime {}.{}, peak bf16 {:.0f} "
          "TFLOP/s from {})\n",
          d, info.name, info.sm_major, info.sm_minor, info.multiprocessors,
          static_cast<double>(info.memory_bytes) / (1 << 30), info.driver_version / 1000,
          info.driver_version % 1000 / 10, info.runtime_version / 1000, info.runtime_version % 1000 / 10,
          peak.peak_flops_per_device / 1e12, peak.source);
    }
  }
  if (TESSERA_HAS_CUDA) out += fmt::format("  cuDNN          {}\n", cuda::cudnn_status());
  return out;
}

}  // namespace tessera::cli
