// `tessera goodput RUN_DIR`: where a run's time went (goodput %, badput by category,
// MFU, tokens/s, disruptions), from RUN_DIR/goodput/events.jsonl, and which rank each
// step waited for, from the per-rank logs events.rank-<R>.jsonl. --json for the full
// report, --html FILE for a self-contained page with charts, --watch to follow a run.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/report.h"

namespace tessera::cli {
namespace {

struct GoodputSettings {
  std::string run_dir;
  bool json = false;
  std::string html;
  bool watch = false;
  double interval_s = 2.0;
};

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

goodput::GoodputReport report(const GoodputSettings& s, bool live) {
  goodput::CalculatorOptions options;
  if (live) options.now = unix_now();
  return goodput::report_for_run(s.run_dir, options);
}

void write_html(const GoodputSettings& s, const goodput::GoodputReport& r) {
  std::vector<std::string> warnings;
  const auto metrics = goodput::read_metrics(std::filesystem::path(s.run_dir) / "metrics.jsonl", &warnings);
  goodput::GoodputReport with_warnings = r;
  with_warnings.warnings.insert(with_warnings.warnings.end(), warnings.begin(), warnings.end());
  // A browser reloading during --watch never sees half a file.
  fileio::write_file_atomic(s.html, goodput::render_html(with_warnings, metrics, "tessera goodput: " + s.run_dir),
                            fileio::Durability::Atomic);
}

int run_goodput(const GoodputSettings& s) {
  if (!std::filesystem::is_directory(s.run_dir)) fail<IOError>("run directory {} does not exist", s.run_dir);
  if (!s.watch) {
    const goodput::GoodputReport r = report(s, false);
    if (s.json)
      fmt::print("{}\n", goodput::report_to_json(r).dump(2));
    else
      fmt::print("{}", goodput::format_table(r));
    if (!s.html.empty()) {
      write_html(s, r);
      if (!s.json) fmt::print("HTML report: {}\n", s.html);
    }
    return 0;
  }
  for (;;) {
    const goodput::GoodputReport r = report(s, true);
    fmt::print("\033[2J\033[H{}  (every {:.0f} s; Ctrl-C to stop)\n", goodput::format_table(r), s.interval_s);
    std::fflush(stdout);
    if (!s.html.empty()) write_html(s, r);
    if (r.finished) return 0;
    std::this_thread::sleep_for(std::chrono::duration<double>(s.interval_s));
  }
}

}  // namespace

Command add_goodput_command(CLI::App& app) {
  auto settings = std::make_shared<GoodputSettings>();
  CLI::App* sub = app.add_subcommand("goodput", "Show where a run's time went: goodput, badput by category, MFU");
  sub->add_option("run_dir", settings->run_dir, "The run directory (holds goodput/events.jsonl)")->required();
  sub->add_flag("--json", settings->json, "Print the full report as JSON");
  sub->add_option("--html", settings->html, "Also write a self-contained HTML report with charts to FILE");
  sub->add_flag("--watch", settings->watch, "Refresh while the run goes on (until it records job_end)");
  sub->add_option("--interval", settings->interval_s, "Seconds between --watch refreshes")
      ->check(CLI::Range(0.1, 3600.0));
  return Command{sub, [settings] { return run_goodput(*settings); }};
}

}  // namespace tessera::cli
