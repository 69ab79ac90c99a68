// The MFU view of the accelerator catalog (see devices.h); the parser is accelerators.cpp.
#include "tessera/goodput/devices.h"

#include <fmt/format.h>

#include <cctype>

#include "tessera/goodput/accelerators.h"

namespace tessera::goodput {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// The gpu and tpu entries: a CPU run's MFU counts against the GEMM rate it measures at
// start-up (goodput::Calibration), not against a catalog figure.
std::vector<DeviceSpec> device_view(const std::vector<AcceleratorSpec>& catalog) {
  std::vector<DeviceSpec> table;
  for (const AcceleratorSpec& a : catalog)
    if (a.kind != "cpu") table.push_back(DeviceSpec{a.key, a.name, a.match, a.peak_flops, a.dtype});
  return table;
}

}  // namespace

std::vector<DeviceSpec> parse_device_table(std::string_view text, const std::string& source) {
  return device_view(parse_accelerator_catalog(text, source));
}

std::vector<DeviceSpec> load_device_table(const std::filesystem::path& toml_path) {
  return device_view(load_accelerator_catalog(toml_path));
}

std::optional<DeviceSpec> find_device(const std::vector<DeviceSpec>& table, std::string_view device_name) {
  const std::string name = lower(device_name);
  for (const DeviceSpec& spec : table)
    for (const std::string& m : spec.match)
      if (!m.empty() && name.find(lower(m)) != std::string::npos) return spec;
  return std::nullopt;
}

const std::vector<DeviceSpec>& builtin_device_table() {
  static const std::vector<DeviceSpec> table = device_view(builtin_accelerator_catalog());
  return table;
}

DeviceRecord device_peak(std::string_view device_name, int count, double estimated_peak_flops,
                         std::string_view estimate_method) {
  DeviceRecord record;
  record.name = std::string(device_name);
  record.count = count;
  if (const std::optional<DeviceSpec> spec = find_device(builtin_device_table(), device_name)) {
    record.peak_flops_per_device = spec->peak_flops;
    record.source = fmt::format("configs/accelerators.toml [{}], {}", spec->key, spec->dtype);
  } else {
    record.peak_flops_per_device = estimated_peak_flops;
    record.source = fmt::format("estimated ({}): not in configs/accelerators.toml", estimate_method);
  }
  return record;
}

}  // namespace tessera::goodput
