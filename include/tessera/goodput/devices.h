// Peak FLOP/s of accelerators, read from configs/devices.toml (dense bf16 datasheet
// numbers), for Program Goodput = achieved model FLOP/s / peak.
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

// What a "device" event records.
struct DeviceRecord {
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3" or "cpu"
  int count = 1;
  double peak_flops_per_device = 0;
  std::string source;  // "configs/devices.toml [h100]", "calibration gemm", ...
};

}  // namespace tessera::goodput
