// Reads the loss curve from RUN_DIR/metrics.jsonl for the HTML report.
#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "tessera/goodput/report.h"

namespace tessera::goodput {

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
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number() || !j.contains("loss") ||
        !j["loss"].is_number() || !std::isfinite(j["loss"].get<double>())) {
      if (bad++ == 0) first_bad = line_no;
      continue;
    }
    points.push_back({j["step"].get<int64_t>(), j["loss"].get<double>()});
  }
  if (bad && warnings)
    warnings->push_back(fmt::format("{}:{}: {} line{} without a numeric \"step\" and finite \"loss\"; skipped",
                                    path.string(), first_bad, bad, bad == 1 ? "" : "s"));
  return points;
}

}  // namespace tessera::goodput
