// A line parser for the small TOML subset of configs/devices.toml (see devices.h).
#include "tessera/goodput/devices.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

#include "goodput/devices_toml.h"
#include "tessera/base/error.h"

namespace tessera::goodput {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Strips a trailing comment that is not inside a string.
std::string_view strip_comment(std::string_view line) {
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '"') in_string = !in_string;
    if (line[i] == '#' && !in_string) return line.substr(0, i);
  }
  return line;
}

std::string parse_string(std::string_view v, const std::string& where) {
  if (v.size() < 2 || v.front() != '"' || v.back() != '"' || v.substr(1, v.size() - 2).find('"') != v.npos)
    fail<ConfigError>("{}: expected a \"string\" without escapes (got {})", where, v);
  return std::string(v.substr(1, v.size() - 2));
}

}  // namespace

std::vector<DeviceSpec> parse_device_table(std::string_view text, const std::string& source) {
  std::vector<DeviceSpec> specs;
  std::istringstream in{std::string(text)};
  std::string raw;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string where = source + ":" + std::to_string(line_no);
    const std::string_view line = trim(strip_comment(raw));
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']' || line.size() < 3) fail<ConfigError>("{}: bad table header {}", where, line);
      specs.emplace_back();
      specs.back().key = std::string(trim(line.substr(1, line.size() - 2)));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == line.npos) fail<ConfigError>("{}: expected key = value (got {})", where, line);
    if (specs.empty()) fail<ConfigError>("{}: key outside a [device] table", where);
    const std::string key(trim(line.substr(0, eq)));
    const std::string_view value = trim(line.substr(eq + 1));
    DeviceSpec& spec = specs.back();
    if (key == "name") {
      spec.name = parse_string(value, where + " name");
    } else if (key == "dtype") {
      spec.dtype = parse_string(value, where + " dtype");
    } else if (key == "peak_flops") {
      double x = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
      if (ec != std::errc() || ptr != value.data() + value.size() || !(x > 0))
        fail<ConfigError>("{}: peak_flops must be a positive number such as 989.0e12 (got {})", where, value);
      spec.peak_flops = x;
    } else if (key == "match") {
      if (value.size() < 2 || value.front() != '[' || value.back() != ']')
        fail<ConfigError>("{}: match must be a list of strings [\"...\"] (got {})", where, value);
      std::string_view rest = value.substr(1, value.size() - 2);
      while (!trim(rest).empty()) {
        const size_t comma = rest.find(',');
        spec.match.push_back(parse_string(trim(rest.substr(0, comma)), where + " match"));
        rest = comma == rest.npos ? std::string_view{} : rest.substr(comma + 1);
      }
    } else {
      fail<ConfigError>("{}: unknown key '{}' in [{}] (expected name, match, peak_flops, dtype)", where, key, spec.key);
    }
  }
  for (const DeviceSpec& spec : specs)
    if (spec.peak_flops <= 0 || spec.match.empty())
      fail<ConfigError>("{}: [{}] needs peak_flops and match", source, spec.key);
  return specs;
}

std::vector<DeviceSpec> load_device_table(const std::filesystem::path& toml_path) {
  std::ifstream in(toml_path);
  if (!in) fail<IOError>("cannot read the device table {}", toml_path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return parse_device_table(text.str(), toml_path.string());
}

std::optional<DeviceSpec> find_device(const std::vector<DeviceSpec>& table, std::string_view device_name) {
  const std::string name = lower(device_name);
  for (const DeviceSpec& spec : table)
    for (const std::string& m : spec.match)
      if (!m.empty() && name.find(lower(m)) != std::string::npos) return spec;
  return std::nullopt;
}

const std::vector<DeviceSpec>& builtin_device_table() {
  static const std::vector<DeviceSpec> table = parse_device_table(devices_toml_text(), "configs/devices.toml");
  return table;
}

DeviceRecord device_peak(std::string_view device_name, int count, double estimated_peak_flops,
                         std::string_view estimate_method) {
  DeviceRecord record;
  record.name = std::string(device_name);
  record.count = count;
  if (const std::optional<DeviceSpec> spec = find_device(builtin_device_table(), device_name)) {
    record.peak_flops_per_device = spec->peak_flops;
    record.source = fmt::format("configs/devices.toml [{}], {}", spec->key, spec->dtype);
  } else {
    record.peak_flops_per_device = estimated_peak_flops;
    record.source = fmt::format("estimated ({}): not in configs/devices.toml", estimate_method);
  }
  return record;
}

}  // namespace tessera::goodput
