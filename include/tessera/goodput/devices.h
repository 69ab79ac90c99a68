// Peak FLOP/s of accelerators for Program Goodput = achieved model FLOP/s / peak: the MFU
// view of the accelerator catalog configs/accelerators.toml (goodput/accelerators.h, which
// gives the format): for each gpu and tpu entry its key, name, match strings and dense
// bf16 peak. A CPU run's MFU counts against the GEMM rate it measures at start-up instead,
// so cpu entries are not in this view. The catalog is compiled into the library
// (builtin_device_table), so every program uses the same numbers.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::goodput {

// A view of AcceleratorSpec.
struct DeviceSpec {
  std::string key;  // the table name, e.g. "h100"
  std::string name;
  std::vector<std::string> match;
  double peak_flops = 0;  // per device
  std::string dtype;
};

std::vector<DeviceSpec> load_device_table(const std::filesystem::path& toml_path);
std::vector<DeviceSpec> parse_device_table(std::string_view text, const std::string& source);

// The first spec one of whose match strings occurs in device_name (case-insensitive).
std::optional<DeviceSpec> find_device(const std::vector<DeviceSpec>& table, std::string_view device_name);

// The gpu and tpu entries of configs/accelerators.toml as it was when this binary was built.
const std::vector<DeviceSpec>& builtin_device_table();

// What a "device" event records.
struct DeviceRecord {
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3" or "cpu"
  int count = 1;
  double peak_flops_per_device = 0;
  std::string source;  // "configs/accelerators.toml [h100], bf16 dense", "calibration gemm", ...
};

// The peak a run on `count` devices named `device_name` counts MFU against: the built-in
// table's entry when one matches (source "configs/accelerators.toml [h100], bf16 dense"), otherwise
// `estimated_peak_flops` per device with `estimate_method` in the source.
DeviceRecord device_peak(std::string_view device_name, int count, double estimated_peak_flops,
                         std::string_view estimate_method);

}  // namespace tessera::goodput
