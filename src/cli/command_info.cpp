// `tessera info`: what this build is and what it runs on (version, threads, BLAS,
// CPU features, CUDA). The first thing to paste into a bug report. `--flags` lists the
// TESSERA_* environment variables (base/flags.h), `--ops` the primitive table
// (ir/primitive_table.h).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/cpu_check.h"
#include "tessera/backend/cuda.h"
#include "tessera/base/flags.h"
#include "tessera/base/thread_pool.h"
#include "tessera/base/version.h"
#include "tessera/ir/primitive_table.h"
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

struct InfoSettings {
  bool ops = false;
  bool flags = false;
  bool markdown = false;
};

int run_info(const InfoSettings& settings) {
  if (settings.ops) {
    // The primitive table (ir/primitive_table.h), as docs/ops.md holds it.
    fmt::print("{}", primitive_table_markdown());
    return 0;
  }
  if (settings.flags) {
    // --markdown: the table docs/flags.md holds (a test compares them); else with this
    // process's values.
    fmt::print("{}", flags::table(!settings.markdown));
    return 0;
  }
  const CpuFeatures cpu = detect_cpu_features();
  fmt::print("tessera {}\n", version());
  fmt::print("  threads        {}\n", num_threads());
  fmt::print("  BLAS           {}\n", blas_description());
  fmt::print("  CPU features   avx2={} fma={} f16c={}\n", yes_no(cpu.avx2), yes_no(cpu.fma), yes_no(cpu.f16c));
  fmt::print("  kernels built  {}\n", kernels_need_avx2() ? "AVX2+FMA+F16C (x86-64-v3)" : "generic (no AVX2)");
  fmt::print("  devices        {} (TESSERA_CPU_DEVICES=N for N virtual devices; mpirun for one per process)\n",
             spmd::runtime_description());
  fmt::print("  MPI            {}\n",
             TESSERA_HAS_MPI ? "yes (mpirun -n N runs one device per rank)" : "no (not built)");
  if (!TESSERA_HAS_CUDA) {
    fmt::print("  CUDA           no (CPU-only build)\n");
  } else if (!cuda::available()) {
    fmt::print("  CUDA           built, but {}\n", cuda::unavailable_reason());
  } else {
    for (int d = 0; d < cuda::device_count(); ++d) {
      const cuda::DeviceInfo info = cuda::device_info(d);
      const goodput::DeviceRecord peak = train::cuda_device_peak(info);
      fmt::print(
          "  GPU {}          {} (sm_{}{}, {} SMs, {:.1f} GiB, driver {}.{}, runtime {}.{}, peak bf16 {:.0f} "
          "TFLOP/s from {})\n",
          d, info.name, info.sm_major, info.sm_minor, info.multiprocessors,
          static_cast<double>(info.memory_bytes) / (1 << 30), info.driver_version / 1000,
          info.driver_version % 1000 / 10, info.runtime_version / 1000, info.runtime_version % 1000 / 10,
          peak.peak_flops_per_device / 1e12, peak.source);
    }
  }
  return 0;
}

}  // namespace

Command add_info_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("info", "Show the version, threads, BLAS, CPU features and CUDA support");
  auto settings = std::make_shared<InfoSettings>();
  sub->add_flag("--flags", settings->flags,
                "List every TESSERA_* environment variable: default, who sets it, what it does, its value here");
  sub->add_flag("--markdown", settings->markdown, "With --flags: the table without values (docs/flags.md)");
  sub->add_flag("--ops", settings->ops,
                "List every primitive: its family and where its CPU evaluation, CUDA kernel and sharding rule live "
                "(or why it has none; docs/ops.md)");
  return Command{sub, [settings] { return run_info(*settings); }};
}

}  // namespace tessera::cli
