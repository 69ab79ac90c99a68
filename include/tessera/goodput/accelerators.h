// The accelerator catalog, configs/accelerators.toml: for every chip the figures that
// Program Goodput (MFU) and the planner (tessera plan, include/tessera/plan/) count
// against. The file is compiled into the library (builtin_accelerator_catalog), so every
// program uses the same numbers; every figure cites its source in a comment there.
//
//   [h100]
//   name = "NVIDIA H100 SXM"
//   match = ["H100"]               # case-insensitive substrings of a device's name
//   kind = "gpu"                   # gpu | tpu | cpu
//   peak_flops = 989.0e12          # dense bf16 FLOP/s per chip
//   dtype = "bf16 dense"
//   peak_int8 = 1979.0e12          # dense int8 op/s per chip
//   memory = 80.0e9                # bytes of device memory (HBM) per chip
//   memory_bandwidth = 3.35e12     # bytes/s
//   matrix_tile = [128, 128, 64]   # M, N, K granularity at which GEMMs fill the matrix units
//   matrix_units = 132             # units a GEMM's output tiles spread over (SMs, MXUs)
//   gemm_efficiency = 0.75         # best fraction of peak a large aligned GEMM reaches
//   attention_efficiency = [0.27, 0.2]  # fraction of peak fused attention reaches: forward, backward
//   memory_efficiency = 0.85       # fraction of memory_bandwidth a streaming kernel reaches
//   kernel_overhead = 4.0e-6       # seconds per kernel (launch and tail)
//   failure_rate = 2.0e-5          # job-interrupting failures per chip-hour
//   price = 6.88                   # USD per chip-hour
//   price_date = "2026-11"
//
//   [h100.link.nvlink]             # interconnect levels, innermost first
//   devices = 8                    # chips one domain of this level joins (0: any number)
//   bandwidth = 450.0e9            # bytes/s per chip, one direction, for collectives
//   latency = 3.0e-6               # seconds per collective step (alpha)
//   topology = "switch"            # switch | ring | torus-2d | torus-3d | network
//
// Only this subset of TOML is accepted: [table] and [table.link.name] headers, key =
// "string" | number | ["string", ...] | [number, ...], comments. Anything else, an unknown
// key or a missing one is a ConfigError naming file:line.
#pragma once

#include <array>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::goodput {

// One level of a chip's interconnect (NVLink domain, InfiniBand network, ICI torus, DCN).
struct InterconnectLevel {
  std::string name;      // "nvlink", "infiniband", "ici", "dcn"
  int64_t devices = 0;   // chips one domain joins; 0: unbounded (the outermost level)
  double bandwidth = 0;  // bytes/s per chip, one direction
  double latency = 0;    // seconds per collective step
  std::string topology;  // switch | ring | torus-2d | torus-3d | network
};

struct AcceleratorSpec {
  std::string key;  // the table name, e.g. "h100"
  std::string name;
  std::vector<std::string> match;
  std::string kind;       // gpu | tpu | cpu
  double peak_flops = 0;  // dense bf16 FLOP/s per chip
  std::string dtype;      // what peak_flops counts ("bf16 dense")
  double peak_int8 = 0;   // dense int8 op/s per chip
  double memory = 0;      // bytes per chip
  double memory_bandwidth = 0;
  std::array<int64_t, 3> matrix_tile = {1, 1, 1};  // M, N, K
  int64_t matrix_units = 1;
  double gemm_efficiency = 0;
  // Fused (flash) attention's share of peak_flops, forward and backward: a softmax between
  // two GEMMs per tile keeps it well under a plain GEMM's, and its backward lower still.
  std::array<double, 2> attention_efficiency = {0, 0};
  double memory_efficiency = 0;
  double kernel_overhead = 0;
  // The share of the batch-axis collectives' time (FSDP gathers and scatters, gradient
  // reductions) that the runtime hides under compute, at most all of the compute.
  double collective_overlap = 0;
  double failure_rate = 0;  // per chip-hour
  double price = 0;         // USD per chip-hour
  std::string price_date;
  std::vector<InterconnectLevel> links;  // innermost first
  std::string source;                    // "configs/accelerators.toml:12" (where the table starts)
};

std::vector<AcceleratorSpec> parse_accelerator_catalog(std::string_view text, const std::string& source);
std::vector<AcceleratorSpec> load_accelerator_catalog(const std::filesystem::path& toml_path);

// configs/accelerators.toml as it was when this binary was built.
const std::vector<AcceleratorSpec>& builtin_accelerator_catalog();

// The entry whose key is `key` (case-insensitive), else the first one of whose match
// strings occurs in `key`; nullopt if none.
std::optional<AcceleratorSpec> find_accelerator(const std::vector<AcceleratorSpec>& catalog, std::string_view key);

}  // namespace tessera::goodput
