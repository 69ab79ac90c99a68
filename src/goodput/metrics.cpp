// Reads the loss curve from RUN_DIR/metrics.jsonl for the HTML report.
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <optional>

#include "tessera/base/json_field.h"
#include "tessera/goodput/report.h"

namespace tessera::goodput {
namespace {

// "step" as an integer, also when written as a float (3.0) that int64 holds: casting one
// it does not hold (1e300, damage) is undefined behaviour, so such a line is bad instead.
std::optional<int64_t> step_of(const nlohmann::json& line) {
  if (const std::optional<int64_t> step = json_field<int64_t>(line, "step")) return step;
  const std::optional<double> d = json_field<double>(line, "step");
  if (!d || !(*d > -9.2e18 && *d < 9.2e18)) return std::nullopt;
  return static_cast<int64_t>(*d);
}

}  // namespace

std::vector<MetricPoint> read_metrics(const std::filesystem::path& path, std::vector<std::string>* warnings) {
  std::vector<MetricPoint> points;
  std::ifstream in(path);
  if (!in) return points;
  std::string line;
  int line_no = 0, bad = 0, first_bad = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    // Validation-only records ({"step", "val_loss"}, the trainer's last line) are not
    // part of the training-loss curve, and not malformed either.
    if (j.is_object() && !j.contains("loss") && j.contains("val_loss") && j["val_loss"].is_number()) continue;
    const std::optional<int64_t> step = step_of(j);
    const std::optional<double> loss = json_field<double>(j, "loss");
    if (!step || !loss || !std::isfinite(*loss)) {
      if (bad++ == 0) first_bad = line_no;
      continue;
    }
    points.push_back({*step, *loss});
  }
  if (bad && warnings)
    warnings->push_back(fmt::format("{}:{}: {} line{} without a numeric \"step\" and finite \"loss\"; skipped",
                                    path.string(), first_bad, bad, bad == 1 ? "" : "s"));
  return points;
}

}  // namespace tessera::goodput
