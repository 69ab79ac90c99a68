// Peak FLOP/s of accelerators, from configs/devices.toml (dense bf16 datasheet numbers),
// for Program Goodput = achieved model FLOP/s / peak. The file is compiled into the
// library (builtin_device_table), so every program uses the same numbers.
//
//   [h100]
//   name = "NVIDIA H100"
//   match = ["H100"]            # case-insensitive substrings of a device name
//   peak_flops = 989.0e12
//   dtype = "bf16 dense"
//
// Only this subset of TOML is accepted: [table] headers, key = "string" | number |
// ["string", ...], comments. Anything else is a ConfigError naming file:line.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::goodput {

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

// configs/devices.toml as it was when this binary was built.
const std::vector<DeviceSpec>& builtin_device_table();

// What a "device" event records.
struct DeviceRecord {
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3" or "cpu"
  int count = 1;
  double peak_flops_per_device = 0;
  std::string source;  // "configs/devices.toml [h100]", "calibration gemm", ...
};

// The peak a run on `count` devices named `device_name` counts MFU against: the built-in
// table's entry when one matches (source "configs/devices.toml [h100]"), otherwise
// `estimated_peak_flops` per device with `estimate_method` in the source.
DeviceRecord device_peak(std::string_view device_name, int count, double estimated_peak_flops,
                         std::string_view estimate_method);

}  // namespace tessera::goodput
