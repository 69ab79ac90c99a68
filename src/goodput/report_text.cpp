// The short goodput table and the JSON form of a report.
#include <fmt/format.h>

#include <cmath>

#include "tessera/goodput/report.h"

namespace tessera::goodput {
namespace {

std::string duration(double s) {
  // The hours as a float rounded down, not an int: a log whose times span more than 2^31
  // hours (damage) must print, not overflow a cast; minutes and seconds are below 60.
  if (!std::isfinite(s)) return fmt::format("{}s", s);
  if (s >= 3600) return fmt::format("{:.0f}h{:02}m", std::floor(s / 3600), static_cast<int>(std::fmod(s, 3600) / 60));
  if (s >= 60) return fmt::format("{}m{:02}s", static_cast<int>(s / 60), static_cast<int>(std::fmod(s, 60)));
  return fmt::format("{:.1f}s", s);
}

std::string si(double x) {
  const char* units[] = {"", "k", "M", "G", "T", "P", "E"};
  int u = 0;
  while (std::fabs(x) >= 1000 && u < 6) x /= 1000, ++u;
  return fmt::format("{:.3g}{}", x, units[u]);
}

}  // namespace

std::string format_table(const GoodputReport& r) {
  std::string out;
  out +=
      fmt::format("goodput{}: {:.1f}% of {} ({} kept steps, {} wasted, {} disruption{}){}\n",
                  r.job.empty() ? "" : " [" + r.job + "]", 100 * r.goodput, duration(r.total_s), r.kept_steps,
                  r.wasted_steps, r.disruptions, r.disruptions == 1 ? "" : "s", r.finished ? "" : " [running or died]");
  out += fmt::format("  {:<30} {:>10} {:>7}\n", "category", "seconds", "%");
  for (int c = 0; c < kNumCategories; ++c) {
    const auto cat = static_cast<Category>(c);
    if (cat != Category::kProductive && r.seconds[c] <= 0) continue;
    out += fmt::format("  {:<30} {:>10.2f} {:>6.2f}%\n", category_label(cat), r.seconds[c], 100 * r.fraction_of(cat));
    if (cat == Category::kCustom)
      for (const auto& [type, s] : r.custom_seconds) out += fmt::format("    {:<28} {:>10.2f}\n", type, s);
  }
  out += fmt::format("  {:<30} {:>10.2f} {:>6.2f}%\n", "total", r.total_s, r.total_s > 0 ? 100.0 : 0.0);
  out += fmt::format(
      "  runtime goodput {:.1f}%  scheduling goodput {:.1f}%{}  MFU {}  => ML productivity {}\n",
      100 * r.runtime_goodput, 100 * r.scheduling_goodput, r.has_scheduling_records ? "" : " (no launcher records)",
      r.program_goodput ? fmt::format("{:.1f}%", 100 * *r.program_goodput) : std::string("n/a"),
      r.ml_productivity_goodput ? fmt::format("{:.1f}%", 100 * *r.ml_productivity_goodput) : std::string("n/a"));
  out += fmt::format("  tokens/s {} (productive) {} (wall)  step time median {:.3f}s MAD {:.3f}s, {} anomalous\n",
                     si(r.tokens_per_s), si(r.effective_tokens_per_s), r.step_stats.median_s, r.step_stats.mad_s,
                     r.step_stats.anomalous.size());
  if (r.pipeline_bubble_s > 0) {
    const double productive = r.seconds_of(Category::kProductive);
    out += fmt::format("  pipeline bubble {:.2f}s of the productive time ({:.1f}%): devices idle in the schedule\n",
                       r.pipeline_bubble_s, productive > 0 ? 100 * r.pipeline_bubble_s / productive : 0.0);
  }
  if (r.program_goodput && r.peak_source.starts_with("CPU"))
    out +=
        "  MFU is relative to the CPU calibration GEMM (measured at start-up, or cached from a quiet run on this "
        "machine: --json's peak_source says which)\n";
  out += format_stragglers(r.stragglers);
  constexpr size_t kShown = 5;
  for (size_t i = 0; i < r.warnings.size() && i < kShown; ++i) out += "  warning: " + r.warnings[i] + "\n";
  if (r.warnings.size() > kShown)
    out += fmt::format("  ... {} more warnings (--json lists them all)\n", r.warnings.size() - kShown);
  return out;
}

nlohmann::json report_to_json(const GoodputReport& r) {
  using nlohmann::json;
  json j;
  j["schema"] = "tessera-goodput-report";
  j["version"] = 1;
  j["job"] = r.job;
  j["start"] = r.start;
  j["end"] = r.end;
  j["total_s"] = r.total_s;
  j["finished"] = r.finished;
  j["goodput"] = r.goodput;
  j["runtime_goodput"] = r.runtime_goodput;
  j["scheduling_goodput"] = r.scheduling_goodput;
  j["has_scheduling_records"] = r.has_scheduling_records;
  j["program_goodput"] = r.program_goodput ? json(*r.program_goodput) : json(nullptr);
  j["ml_productivity_goodput"] = r.ml_productivity_goodput ? json(*r.ml_productivity_goodput) : json(nullptr);
  j["peak_flops"] = r.peak_flops;
  j["peak_source"] = r.peak_source;
  json seconds = json::object(), percent = json::object();
  for (int c = 0; c < kNumCategories; ++c) {
    const std::string name(category_name(static_cast<Category>(c)));
    seconds[name] = r.seconds[c];
    percent[name] = r.total_s > 0 ? 100 * r.seconds[c] / r.total_s : 0.0;
  }
  j["seconds"] = seconds;
  j["percent"] = percent;
  j["custom_seconds"] = r.custom_seconds;
  j["disruptions"] = r.disruptions;
  j["kept_steps"] = r.kept_steps;
  j["wasted_steps"] = r.wasted_steps;
  j["tokens"] = r.tokens;
  j["model_flops"] = r.model_flops;
  j["pipeline_bubble_s"] = r.pipeline_bubble_s;
  j["tokens_per_s"] = r.tokens_per_s;
  j["effective_tokens_per_s"] = r.effective_tokens_per_s;
  json attempts = json::array();
  for (const AttemptSummary& a : r.attempts)
    attempts.push_back({{"attempt", a.attempt},
                        {"start", a.start},
                        {"end", a.end},
                        {"reason", a.reason},
                        {"disrupted", a.disrupted},
                        {"failure", a.failure},
                        {"first_step", a.first_step},
                        {"last_step", a.last_step},
                        {"steps", a.steps}});
  j["attempts"] = attempts;
  const StepStats& st = r.step_stats;
  json anomalous = json::array();
  for (const auto& [attempt, step] : st.anomalous) anomalous.push_back({{"attempt", attempt}, {"step", step}});
  json windows = json::array();
  for (const WindowStats& w : st.windows)
    windows.push_back({{"window_s", w.window_s},
                       {"covered_s", w.covered_s},
                       {"goodput", w.goodput},
                       {"steps", w.steps},
                       {"tokens_per_s", w.tokens_per_s},
                       {"median_step_s", w.median_step_s}});
  j["step_stats"] = {{"count", st.count}, {"median_s", st.median_s}, {"mad_s", st.mad_s},      {"mean_s", st.mean_s},
                     {"min_s", st.min_s}, {"max_s", st.max_s},       {"anomalous", anomalous}, {"windows", windows}};
  j["stragglers"] = stragglers_to_json(r.stragglers);
  j["warnings"] = r.warnings;
  j["notes"] = r.notes;
  return j;
}

GoodputReport report_for_run(const std::filesystem::path& run_dir, const CalculatorOptions& options) {
  GoodputReport r = compute_goodput(read_event_log(event_log_path(run_dir)), options);
  std::vector<std::pair<int, double>> attempt_starts;
  for (const AttemptSummary& a : r.attempts) attempt_starts.emplace_back(a.attempt, a.start);
  r.stragglers = compute_stragglers(read_rank_logs(run_dir), attempt_starts);
  return r;
}

}  // namespace tessera::goodput
