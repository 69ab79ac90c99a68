// The HTML goodput report: one file, inline SVG charts, no scripts, no network.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessera/goodput/report.h"

namespace tessera::goodput {
namespace {

constexpr std::array<const char*, kNumCategories> kColors{
    "#2e7d32",  // productive
    "#9e9e9e",  // scheduling wait
    "#6a1b9a",  // init
    "#1565c0",  // compile
    "#00838f",  // checkpoint restore
    "#ef6c00",  // checkpoint save
    "#f9a825",  // data loading
    "#c62828",  // wasted progress
    "#ad1457",  // infrastructure recovery
    "#5d4037",  // eval
    "#8bc34a",  // program start-up
    "#795548",  // custom
    "#cfd8dc",  // other
};

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

constexpr double kWidth = 1100, kLeft = 110, kRight = 20;

std::string timeline(const GoodputReport& r) {
  const double span = std::max(r.total_s, 1e-9);
  const double plot = kWidth - kLeft - kRight;
  auto x = [&](double t) { return kLeft + plot * (t - r.start) / span; };
  const int rows = 2 + static_cast<int>(r.attempts.size());
  const double row_h = 26, height = 40 + rows * row_h + 60;
  std::string s = fmt::format(
      "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"4\" y=\"16\" font-weight=\"bold\">Timeline of attempts "
      "and phases ({:.1f} s)</text>\n",
      kWidth, height, r.total_s);
  double y = 30;
  s += fmt::format("<text x=\"4\" y=\"{}\">phases</text>\n", y + 16);
  for (const Segment& seg : r.segments)
    s += fmt::format(
        "<rect class=\"seg\" x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"20\" fill=\"{}\"><title>{} {:.3f}-{:.3f} "
        "s{}</title></rect>\n",
        x(seg.start), y, std::max(0.5, x(seg.end) - x(seg.start)), kColors[static_cast<int>(seg.category)],
        category_name(seg.category), seg.start - r.start, seg.end - r.start,
        seg.step >= 0 ? fmt::format(" step {}", seg.step) : std::string());
  y += row_h;
  s += fmt::format("<text x=\"4\" y=\"{}\">async saves</text>\n", y + 16);
  for (const auto& [a, b] : r.background_saves)
    s += fmt::format("<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"10\" fill=\"#ffb74d\"/>\n", x(a), y + 5,
                     std::max(0.5, x(b) - x(a)));
  for (const AttemptSummary& a : r.attempts) {
    y += row_h;
    s += fmt::format("<text x=\"4\" y=\"{}\">attempt {}</text>\n", y + 16, a.attempt);
    s += fmt::format(
        "<rect class=\"attempt\" x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"20\" fill=\"{}\" "
        "stroke=\"#333\"><title>"
        "attempt {}: steps {}..{}{}{}</title></rect>\n",
        x(a.start), y, std::max(0.5, x(a.end) - x(a.start)), a.disrupted ? "#ffcdd2" : "#c8e6c9", a.attempt,
        a.first_step, a.last_step, a.reason.empty() ? "" : "; started because: " + escape(a.reason),
        a.failure.empty() ? "" : "; failed: " + escape(a.failure));
    if (a.disrupted)
      s += fmt::format(
          "<line x1=\"{0:.2f}\" x2=\"{0:.2f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#c62828\" stroke-width=\"3\"/>\n",
          x(a.end), y - 2, y + 22);
  }
  y += row_h + 10;
  double lx = kLeft;
  for (int c = 0; c < kNumCategories; ++c) {
    if (r.seconds[c] <= 0) continue;
    const std::string name(category_name(static_cast<Category>(c)));
    const double item_w = 24 + 7.0 * static_cast<double>(name.size());
    if (lx + item_w > kWidth) lx = kLeft, y += 16;
    s += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n", lx, y,
        kColors[c], lx + 14, y + 10, name);
    lx += item_w;
  }
  return s + "</svg>\n";
}

std::string breakdown(const GoodputReport& r) {
  std::vector<int> shown;
  for (int c = 0; c < kNumCategories; ++c)
    if (r.seconds[c] > 0) shown.push_back(c);
  const double bar_h = 22, height = 36 + bar_h * static_cast<double>(shown.size()) + 10;
  const double left = 230, plot = kWidth - left - 160;
  double max_s = 0;
  for (int c : shown) max_s = std::max(max_s, r.seconds[c]);
  std::string s = fmt::format(
      "<svg id=\"breakdown\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"4\" y=\"16\" font-weight=\"bold\">Where the time went "
      "(goodput and badput by category)</text>\n",
      kWidth, height);
  double y = 30;
  for (int c : shown) {
    const double w = max_s > 0 ? plot * r.seconds[c] / max_s : 0;
    s += fmt::format(
        "<text x=\"4\" y=\"{}\">{}</text><rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" "
        "fill=\"{}\"/><text x=\"{:.2f}\" y=\"{}\">{:.2f} s ({:.2f}%)</text>\n",
        y + 15, escape(category_label(static_cast<Category>(c))), left, y, std::max(1.0, w), bar_h - 4, kColors[c],
        left + w + 6, y + 15, r.seconds[c], 100 * r.fraction_of(static_cast<Category>(c)));
    y += bar_h;
  }
  return s + "</svg>\n";
}

// A line/scatter chart of (x, y) series; points outside finite range are skipped.
struct Series {
  std::vector<std::pair<double, double>> points;
  const char* color;
  bool line;
  std::string label;
};

std::string xy_chart(const char* id, const std::string& title, const std::string& xlabel, const std::string& ylabel,
                     const std::vector<Series>& series) {
  const double height = 300, top = 30, bottom = 40, plot_w = kWidth - kLeft - kRight, plot_h = height - top - bottom;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& se : series)
    for (const auto& [px, py] : se.points) {
      x0 = std::min(x0, px), x1 = std::max(x1, px), y0 = std::min(y0, py), y1 = std::max(y1, py);
    }
  std::string s = fmt::format(
      "<svg id=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<text x=\"4\" y=\"16\" font-weight=\"bold\">{}</text>\n",
      id, kWidth, height, escape(title));
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", kLeft, top,
                   plot_w, plot_h);
  if (!std::isfinite(x0))
    return s + fmt::format("<text x=\"{}\" y=\"{}\">no data</text></svg>\n", kLeft + 10, top + 20);
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) y0 -= std::max(1e-9, std::fabs(y0) * 0.1), y1 += std::max(1e-9, std::fabs(y1) * 0.1);
  y0 = std::min(y0, y0 >= 0 && y0 < 0.2 * y1 ? 0.0 : y0);
  auto X = [&](double v) { return kLeft + plot_w * (v - x0) / (x1 - x0); };
  auto Y = [&](double v) { return top + plot_h * (1 - (v - y0) / (y1 - y0)); };
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.4g}</text>\n", kLeft - 4, top + 10, y1);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.4g}</text>\n", kLeft - 4, top + plot_h, y0);
  s += fmt::format("<text x=\"{}\" y=\"{}\">{:.6g}</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.6g}</text>\n",
                   kLeft, height - 22, x0, kLeft + plot_w, height - 22, x1);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", kLeft + plot_w / 2, height - 6,
                   escape(xlabel));
  s += fmt::format("<text x=\"12\" y=\"{}\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">{}</text>\n",
                   top + plot_h / 2, top + plot_h / 2, escape(ylabel));
  double legend_x = kLeft + 10;
  for (const Series& se : series) {
    if (se.points.empty()) continue;
    if (se.line) {
      std::string pts;
      for (const auto& [px, py] : se.points) pts += fmt::format("{:.2f},{:.2f} ", X(px), Y(py));
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>\n", pts, se.color);
    } else {
      for (const auto& [px, py] : se.points)
        s += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2.5\" fill=\"{}\"/>\n", X(px), Y(py), se.color);
    }
    s += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n", legend_x,
        top + 6, se.color, legend_x + 14, top + 15, escape(se.label));
    legend_x += 40 + 7.0 * static_cast<double>(se.label.size());
  }
  return s + "</svg>\n";
}

constexpr std::array<const char*, 8> kRankColors{"#1565c0", "#c62828", "#2e7d32", "#6a1b9a",
                                                 "#ef6c00", "#00838f", "#ad1457", "#5d4037"};

// Per-rank step records merged: each step's excess over the median rank, coloured by
// the rank that was slowest, a row per rank and the worst steps.
std::string stragglers_section(const StragglerReport& st) {
  if (!st.present) return "";
  std::string s = fmt::format(
      "<section id=\"stragglers\"><h2>Stragglers</h2>\n<p>{} rank(s) recorded, {} steps compared: <b>{:.3f} s "
      "lost</b> (sum over steps of the slowest rank's own time minus the median rank's; own time = step time minus "
      "time inside collectives); {} step(s) over {:.0f}% above the median{}.</p>\n",
      st.ranks.size(), st.steps.size(), st.lost_s, st.straggler_steps, 100 * st.threshold,
      st.slowest_rank >= 0 ? fmt::format("; slowest rank overall: <b>rank {}</b>", st.slowest_rank) : std::string());
  std::vector<Series> series;
  for (size_t i = 0; i < st.ranks.size(); ++i) {
    Series se{{}, kRankColors[i % kRankColors.size()], false, fmt::format("rank {}", st.ranks[i].rank)};
    for (const StepStraggler& x : st.steps)
      if (x.slowest_rank == st.ranks[i].rank && x.slowest_s > x.fastest_s)
        se.points.emplace_back(static_cast<double>(x.step), x.excess_s());
    series.push_back(std::move(se));
  }
  s += xy_chart("straggler-excess", "Excess of the slowest rank over the median, per step (colour: the slowest rank)",
                "step", "seconds over the median", series);
  s += "<table><tr><th>rank</th><th>steps</th><th>slowest in</th><th>seconds charged</th><th>median own step "
       "s</th><th>data wait s</th><th>collectives s</th></tr>\n";
  for (const RankStragglerStats& r : st.ranks)
    s += fmt::format(
        "<tr class=\"rank-row\"><td>rank {}</td><td>{}</td><td>{}</td><td>{:.3f}</td><td>{:.4f}</td><td>{:.3f}</td>"
        "<td>{:.3f}</td></tr>\n",
        r.rank, r.steps, r.slowest_count, r.lost_s, r.median_own_s, r.data_wait_s, r.collective_s);
  s += "</table>\n<h3>Worst steps</h3><table><tr><th>attempt</th><th>step</th><th>slowest rank</th><th>its "
       "s</th><th>median s</th><th>fastest s</th><th>excess s</th></tr>\n";
  for (const StepStraggler& x : st.worst)
    s += fmt::format(
        "<tr class=\"worst-step\"><td>{}</td><td>{}</td><td>{}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.3f}</td>"
        "<td>{:.3f}</td></tr>\n",
        x.attempt, x.step, x.slowest_rank, x.slowest_s, x.median_s, x.fastest_s, x.excess_s());
  s += "</table>\n";
  if (!st.notes.empty()) {
    s += "<ul id=\"straggler-notes\">";
    for (const std::string& n : st.notes) s += "<li>" + escape(n) + "</li>";
    s += "</ul>\n";
  }
  return s + "</section>\n";
}

}  // namespace

std::string render_html(const GoodputReport& r, const std::vector<MetricPoint>& metrics, std::string_view title) {
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title>\n<style>body{{font-family:"
      "sans-serif;margin:20px;color:#222}} table{{border-collapse:collapse}} td,th{{padding:2px 10px;text-align:"
      "right}} td:first-child,th:first-child{{text-align:left}} pre{{background:#f5f5f5;padding:8px}} section{{margin:"
      "18px 0}}</style></head><body>\n<h1>{0}</h1>\n",
      escape(title));
  html += fmt::format(
      "<p id=\"headline\"><b>Goodput {:.1f}%</b> of {:.1f} s &middot; runtime goodput {:.1f}% &middot; scheduling "
      "goodput {:.1f}%{} &middot; MFU {} &middot; ML productivity goodput {} &middot; {} disruption(s) &middot; "
      "{:.4g} tokens/s (productive)</p>\n",
      100 * r.goodput, r.total_s, 100 * r.runtime_goodput, 100 * r.scheduling_goodput,
      r.has_scheduling_records ? "" : " (no launcher records)",
      r.program_goodput ? fmt::format("{:.1f}%", 100 * *r.program_goodput) : std::string("n/a"),
      r.ml_productivity_goodput ? fmt::format("{:.1f}%", 100 * *r.ml_productivity_goodput) : std::string("n/a"),
      r.disruptions, r.tokens_per_s);
  html += "<section>" + timeline(r) + "</section>\n<section>" + breakdown(r) + "</section>\n";

  std::vector<std::pair<double, double>> kept, wasted, anomalous;
  for (const StepExec& x : r.steps) {
    if (!x.completed) continue;
    (x.kept ? kept : wasted).emplace_back(static_cast<double>(x.step), x.end - x.start);
    for (const auto& [attempt, step] : r.step_stats.anomalous)
      if (attempt == x.attempt && step == x.step) anomalous.emplace_back(static_cast<double>(x.step), x.end - x.start);
  }
  html += "<section>" +
          xy_chart("step-time",
                   fmt::format("Step time over steps (median {:.4g} s, MAD {:.3g} s)", r.step_stats.median_s,
                               r.step_stats.mad_s),
                   "step", "seconds",
                   {{kept, "#2e7d32", false, "kept"},
                    {wasted, "#c62828", false, "wasted"},
                    {anomalous, "#ff6f00", false, "anomalous (MAD)"}}) +
          "</section>\n";
  std::vector<std::pair<double, double>> loss;
  for (const MetricPoint& p : metrics) loss.emplace_back(static_cast<double>(p.step), p.loss);
  html += "<section>" + xy_chart("loss", "Loss (metrics.jsonl)", "step", "loss", {{loss, "#1565c0", true, "loss"}}) +
          "</section>\n";
  html += stragglers_section(r.stragglers);
  html += "<section><h2>Summary</h2><pre>" + escape(format_table(r)) + "</pre>";
  if (!r.notes.empty()) {
    html += "<ul>";
    for (const std::string& n : r.notes) html += "<li>" + escape(n) + "</li>";
    html += "</ul>";
  }
  if (!r.warnings.empty()) {
    html += "<h2>Warnings</h2><ul id=\"warnings\">";
    for (const std::string& w : r.warnings) html += "<li>" + escape(w) + "</li>";
    html += "</ul>";
  }
  return html + "</section>\n</body></html>\n";
}

}  // namespace tessera::goodput
