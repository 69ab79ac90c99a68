// Reports of a GoodputReport: the short table (printed by `tessera goodput RUN_DIR` and
// by the trainer at the end of every run), JSON (--json) and one self-contained HTML
// file with inline SVG charts (--html FILE; no scripts or network).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/goodput/calculator.h"

namespace tessera::goodput {

// Goodput %, one row per badput category (seconds, % of total), MFU, tokens/s,
// disruptions, the straggler section when there are per-rank logs, then warnings and
// notes (at most a few lines each).
std::string format_table(const GoodputReport& report);

nlohmann::json report_to_json(const GoodputReport& report);

// The straggler section of the table: seconds lost, the slowest rank, a row per rank
// (times slowest, seconds charged), the worst steps and notes; "" without per-rank logs.
std::string format_stragglers(const StragglerReport& stragglers);

// Everything, including every compared step: {"present","world_size","lost_s",...}.
nlohmann::json stragglers_to_json(const StragglerReport& stragglers);

struct MetricPoint {
  int64_t step = 0;
  double loss = 0;
};

// RUN_DIR/metrics.jsonl lines {"step":N,"loss":x,...}; bad lines are skipped with a
// warning appended to *warnings. A missing file gives no points and no warning.
std::vector<MetricPoint> read_metrics(const std::filesystem::path& path, std::vector<std::string>* warnings);

// The HTML document: summary table, timeline of attempts and phases, badput breakdown,
// step time over steps, loss curve (when there are metrics), stragglers (when there are
// per-rank logs).
std::string render_html(const GoodputReport& report, const std::vector<MetricPoint>& metrics, std::string_view title);

// read_event_log(RUN_DIR/goodput/events.jsonl) + compute_goodput, and the straggler
// attribution of the per-rank logs (RUN_DIR/goodput/events.rank-<R>.jsonl).
GoodputReport report_for_run(const std::filesystem::path& run_dir, const CalculatorOptions& options = {});

}  // namespace tessera::goodput
