// The HTML page of `tessera plan --html`. Chips are on a log2 axis, so the doubling chip
// counts of a strong-scaling sweep are evenly spaced. Step time and run time use a log
// y-axis too: perfect strong scaling halves them at each doubling, a straight line.
// Tokens/s per chip, dollars and the weak-scaling step time start a linear axis at zero,
// where perfect scaling is a flat line.
//
// A row whose layout does not fit in memory is a hollow marker off the line (the
// planner costed it, nobody can run it); a row with no valid layout has no value and is
// listed under the charts with the planner's reason.
#include "tessera/plan/report_html.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <vector>

namespace tessera::plan {
namespace {

using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::array<const char*, 8> kColors{"#1565c0", "#c62828", "#2e7d32", "#ef6c00",
                                             "#6a1b9a", "#00838f", "#ad1457", "#5d4037"};

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else if (c == '\'')
      out += "&#39;";
    else
      out += c;
  }
  return out;
}

const json* lookup(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* key : path) {
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &at->at(key);
  }
  return at;
}

// A number of the plan, NaN when absent or null (nlohmann writes infinities as null).
double num(const json& j, std::initializer_list<const char*> path) {
  const json* v = lookup(j, path);
  return v != nullptr && v->is_number() ? v->get<double>() : kNaN;
}

bool flag(const json& j, std::initializer_list<const char*> path) {
  const json* v = lookup(j, path);
  return v != nullptr && v->is_boolean() && v->get<bool>();
}

std::string text(const json& j, const char* key) {
  const json* v = lookup(j, {key});
  if (v == nullptr || v->is_null()) return "";
  return v->is_string() ? v->get<std::string>() : v->dump();
}

// The row's layout as the tables print it (older --json output has only "mesh").
std::string layout_text(const json& row) {
  const std::string layout = text(row, "layout");
  return layout.empty() ? text(row, "mesh") : layout;
}

const json& rows_of(const json& plan, const char* key) {
  static const json empty = json::array();
  const json* v = lookup(plan, {key});
  return v != nullptr && v->is_array() ? *v : empty;
}

std::string or_dash(double v, const std::string& shown) { return std::isfinite(v) ? shown : "-"; }

std::string tick_text(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.3g}k", v / 1e3);
  return fmt::format("{:.3g}", v);
}

// The step of about `count` ticks over `span`: 1, 2 or 5 times a power of ten.
double nice_step(double span, int count) {
  const double raw = span / count, decade = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * decade >= raw) return m * decade;
  return 10 * decade;
}

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::vector<double> ticks;
  double fraction(double v) const { return log ? std::log(v / lo) / std::log(hi / lo) : (v - lo) / (hi - lo); }
};

void linear_ticks(Axis& a, int count) {
  const double step = nice_step(a.hi - a.lo, count);
  for (int i = static_cast<int>(std::ceil(a.lo / step)); i * step <= a.hi * (1 + 1e-12); ++i)
    a.ticks.push_back(i * step);
}

Axis value_axis(double lo, double hi, bool log) {
  Axis a;
  a.log = log;
  if (log) {
    a.lo = lo / 1.3, a.hi = hi * 1.3;
    // The sparsest mantissas that give four ticks: decades, then 1-2-5, then more.
    const int e0 = static_cast<int>(std::floor(std::log10(a.lo))), e1 = static_cast<int>(std::ceil(std::log10(a.hi)));
    for (const std::vector<double>& mantissas :
         std::vector<std::vector<double>>{{1}, {1, 2, 5}, {1, 2, 3, 5, 7}, {1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9}}) {
      a.ticks.clear();
      for (int e = e0; e <= e1; ++e)
        for (double m : mantissas)
          if (const double v = m * std::pow(10.0, e); v >= a.lo && v <= a.hi) a.ticks.push_back(v);
      if (a.ticks.size() >= 4) break;
    }
    if (a.ticks.size() < 3) a.ticks.clear(), linear_ticks(a, 4);
    return a;
  }
  a.lo = std::min(0.0, lo);
  const double top = hi > a.lo ? hi + 0.05 * (hi - a.lo) : a.lo + 1;
  const double step = nice_step(top - a.lo, 5);
  a.hi = step * std::ceil(top / step);
  linear_ticks(a, 5);
  return a;
}

struct Point {
  double chips = 0, value = 0;
  bool fits = true;
  std::string tip;
};

struct Series {
  std::string name;
  std::vector<Point> points;
};

struct Chart {
  const char* id;
  std::string title, y_label;
  bool log_y = false;
  std::function<double(const json&)> value;
  std::function<std::string(double)> show;
  bool relative = false;  // tooltips add the share of the series' first fitting value
};

// One series per accelerator in the order the plan lists them (the same colours in
// every chart); rows without a value are left out.
std::vector<Series> series_of(const json& rows, const Chart& chart) {
  std::vector<Series> out;
  for (const json& r : rows) {
    const std::string acc = text(r, "accelerator");
    auto it = std::find_if(out.begin(), out.end(), [&](const Series& s) { return s.name == acc; });
    if (it == out.end()) it = out.insert(out.end(), Series{acc, {}});
    const double chips = num(r, {"chips"}), v = flag(r, {"found"}) ? chart.value(r) : kNaN;
    if (!std::isfinite(v) || !(chips >= 1) || (chart.log_y && v <= 0)) continue;
    const bool fits = flag(r, {"memory", "fits"});
    it->points.push_back({chips, v, fits,
                          fmt::format("{} x{} {}: {}{}", acc, chips, layout_text(r), chart.show(v),
                                      fits ? "" : " (does not fit in memory)")});
  }
  for (Series& s : out) {
    std::sort(s.points.begin(), s.points.end(), [](const Point& a, const Point& b) { return a.chips < b.chips; });
    const auto base = std::find_if(s.points.begin(), s.points.end(), [](const Point& p) { return p.fits; });
    if (chart.relative && base != s.points.end())
      for (Point& p : s.points) p.tip += fmt::format(", {:.0f}% of x{}", 100 * p.value / base->value, base->chips);
  }
  return out;
}

constexpr double kWidth = 550, kHeight = 300, kTop = 34, kBottom = 44, kLeft = 62;

std::string render_chart(const Chart& chart, const std::vector<Series>& series) {
  size_t longest = 11;
  for (const Series& se : series) longest = std::max(longest, se.name.size());
  const double legend_w = std::min(200.0, 30 + 6.5 * static_cast<double>(longest));
  const double plot_w = kWidth - kLeft - legend_w - 14, plot_h = kHeight - kTop - kBottom, bottom = kTop + plot_h;
  std::string s = fmt::format(
      "<svg id=\"{}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"4\" y=\"16\" font-size=\"13\" "
      "font-weight=\"bold\">{}</text>\n",
      chart.id, kWidth, kHeight, escape(chart.title));
  double c_lo = kInf, c_hi = -kInf, v_lo = kInf, v_hi = -kInf;
  bool hollow = false;
  std::vector<double> chips;
  for (const Series& se : series)
    for (const Point& p : se.points) {
      c_lo = std::min(c_lo, p.chips), c_hi = std::max(c_hi, p.chips);
      v_lo = std::min(v_lo, p.value), v_hi = std::max(v_hi, p.value);
      hollow = hollow || !p.fits;
      chips.push_back(p.chips);
    }
  if (chips.empty())
    return s + fmt::format("<text x=\"{}\" y=\"{}\">no row has a value to draw</text></svg>\n", kLeft, kTop + 20);

  const double x_lo = std::log2(c_lo) - 0.35, x_hi = std::log2(c_hi) + 0.35;
  auto X = [&](double c) { return kLeft + plot_w * (std::log2(c) - x_lo) / (x_hi - x_lo); };
  const Axis y = value_axis(v_lo, v_hi, chart.log_y);
  auto Y = [&](double v) { return kTop + plot_h * (1 - y.fraction(v)); };
  for (double t : y.ticks)
    s += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#e6e6e6\"/><text x=\"{3}\" y=\"{4:.1f}\" "
        "text-anchor=\"end\">{5}</text>\n",
        kLeft, kLeft + plot_w, Y(t), kLeft - 5, Y(t) + 4, tick_text(t));
  std::sort(chips.begin(), chips.end());
  chips.erase(std::unique(chips.begin(), chips.end()), chips.end());
  double labelled = -kInf;  // chip labels closer than 26 px to the last one are skipped
  for (double c : chips) {
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#e6e6e6\"/>\n", X(c), kTop,
                     bottom);
    if (X(c) - labelled < 26) continue;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", X(c), bottom + 15, c);
    labelled = X(c);
  }
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", kLeft, kTop,
                   plot_w, plot_h);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">chips (log2 scale)</text>\n", kLeft + plot_w / 2,
                   kHeight - 8);
  s += fmt::format("<text x=\"13\" y=\"{0}\" transform=\"rotate(-90 13 {0})\" text-anchor=\"middle\">{1}{2}</text>\n",
                   kTop + plot_h / 2, escape(chart.y_label), y.log ? " (log scale)" : "");

  const double legend_x = kLeft + plot_w + 14;
  double legend_y = kTop + 8;
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& se = series[i];
    const char* color = kColors[i % kColors.size()];
    std::string line;
    for (const Point& p : se.points)
      if (p.fits) line += fmt::format("{:.1f},{:.1f} ", X(p.chips), Y(p.value));
    if (std::count_if(se.points.begin(), se.points.end(), [](const Point& p) { return p.fits; }) >= 2)
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", line, color);
    for (const Point& p : se.points)
      s += fmt::format(
          "<circle class=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\" stroke=\"{}\" "
          "stroke-width=\"1.5\"><title>{}</title></circle>\n",
          p.fits ? "pt" : "pt-open", X(p.chips), Y(p.value), p.fits ? color : "#fff", color, escape(p.tip));
    s += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"{3}\" stroke-width=\"2\"/><circle cx=\"{4}\" "
        "cy=\"{2}\" r=\"3.5\" fill=\"{3}\"/><text class=\"legend\" x=\"{5}\" y=\"{6}\">{7}</text>\n",
        legend_x, legend_x + 18, legend_y, color, legend_x + 9, legend_x + 24, legend_y + 4, escape(se.name));
    legend_y += 18;
  }
  if (hollow)
    s += fmt::format(
        "<circle cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"#fff\" stroke=\"#555\" stroke-width=\"1.5\"/><text x=\"{}\" "
        "y=\"{}\">does not fit</text>\n",
        legend_x + 9, legend_y, legend_x + 24, legend_y + 4);
  return s + "</svg>\n";
}

std::string gb(double bytes) { return or_dash(bytes, fmt::format("{:.1f}", bytes / 1e9)); }

std::string percent(double share) { return or_dash(share, fmt::format("{:.1f}%", 100 * share)); }

// A table of plan rows; a row with a reason (nothing valid, or what does not fit and the
// change that does) is followed by the reason.
std::string rows_table(const json& rows, const char* id) {
  std::string s = fmt::format(
      "<table id=\"{}\"><tr><th>accelerator</th><th>chips</th><th>layout</th><th>step</th><th>MFU</th><th>memory/chip"
      "</th><th>time</th><th>cost</th><th>time*</th><th>cost*</th><th>goodput</th></tr>\n",
      id);
  for (const json& r : rows) {
    const std::string acc = escape(text(r, "accelerator")), chips = or_dash(num(r, {"chips"}), text(r, "chips"));
    const std::string reason = escape(text(r, "reason"));
    if (!flag(r, {"found"})) {
      s += fmt::format("<tr class=\"none\"><td>{}</td><td>{}</td><td colspan=\"9\">{}</td></tr>\n", acc, chips,
                       reason.empty() ? "no chip count in the range fits" : reason);
      continue;
    }
    const double peak = num(r, {"memory", "peak"}), capacity = num(r, {"memory", "capacity"});
    const bool fits = flag(r, {"memory", "fits"});
    s += fmt::format(
        "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {} GB, {}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>\n",
        fits ? "" : " class=\"nofit\"", acc, chips, escape(layout_text(r)), format_duration(num(r, {"step_seconds"})),
        percent(num(r, {"mfu"})), gb(peak), or_dash(capacity, fmt::format("{:.0f}", capacity / 1e9)),
        fits ? "fits" : fmt::format("<b>over by {} GB</b>", gb(peak - capacity)),
        format_duration(num(r, {"run", "raw_seconds"})), format_dollars(num(r, {"run", "dollars_raw"})),
        format_duration(num(r, {"run", "seconds"})), format_dollars(num(r, {"run", "dollars"})),
        percent(num(r, {"run", "goodput"})));
    if (!reason.empty()) s += fmt::format("<tr class=\"reason\"><td></td><td colspan=\"10\">{}</td></tr>\n", reason);
  }
  return s + "</table>\n";
}

// The rows a chart cannot draw as a filled marker, and why.
std::string notes(const json& rows) {
  std::string s;
  for (const json& r : rows) {
    const bool found = flag(r, {"found"});
    if (found && flag(r, {"memory", "fits"})) continue;
    s += fmt::format("<li>{} x{}: {}{}</li>", escape(text(r, "accelerator")), escape(text(r, "chips")),
                     found ? "does not fit in memory (hollow marker)" : "no valid layout (not drawn)",
                     text(r, "reason").empty() ? "" : ": " + escape(text(r, "reason")));
  }
  return s.empty() ? "" : "<ul class=\"notes\">" + s + "</ul>\n";
}

std::string charts(const json& rows, const std::vector<Chart>& list) {
  std::string s = "<div class=\"charts\">\n";
  for (const Chart& c : list) s += render_chart(c, series_of(rows, c));
  return s + "</div>\n" + notes(rows);
}

}  // namespace

std::string format_duration(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 1) return fmt::format("{:.1f} ms", s * 1e3);
  if (s < 120) return fmt::format("{:.2f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  if (s < 3 * 86400) return fmt::format("{:.1f} h", s / 3600);
  return fmt::format("{:.1f} d", s / 86400);
}

std::string format_dollars(double d) {
  if (!std::isfinite(d)) return "-";
  if (d >= 1e6) return fmt::format("${:.2f}M", d / 1e6);
  if (d >= 1e3) return fmt::format("${:.1f}k", d / 1e3);
  return fmt::format("${:.2f}", d);
}

std::string render_plan_html(const json& plan, const std::string& title) {
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title>\n<style>body{{font-family:"
      "sans-serif;margin:20px;color:#222}} table{{border-collapse:collapse;margin:8px 0}} td,th{{padding:2px 9px;"
      "text-align:right;border-bottom:1px solid #eee}} td:first-child,th:first-child,td[colspan]{{text-align:left}} "
      "tr.nofit td{{color:#b71c1c}} tr.reason td,tr.none td,.notes{{color:#666;font-size:90%}} .charts{{display:flex;"
      "flex-wrap:wrap;gap:8px 16px}} p{{max-width:1100px}}</style></head><body>\n<h1>{0}</h1>\n",
      escape(title));
  const double params = num(plan, {"parameters"}), tokens = num(plan, {"tokens"});
  html += fmt::format(
      "<p id=\"job\"><b>{}</b> &middot; {} parameters &middot; batch {} x {} tokens &middot; {} &middot; remat {} "
      "&middot; {} tokens to train on &middot; a failure costs a {} restart, a checkpoint save blocks {}</p>\n",
      escape(text(plan, "model")),
      or_dash(params, params >= 1e9 ? fmt::format("{:.2f}B", params / 1e9) : fmt::format("{:.1f}M", params / 1e6)),
      escape(text(plan, "batch")), escape(text(plan, "seq")), escape(text(plan, "compute_dtype")),
      escape(text(plan, "remat")), or_dash(tokens, fmt::format("{:.3g}", tokens)),
      format_duration(num(plan, {"restart_seconds"})), format_duration(num(plan, {"save_seconds"})));

  const json& summary = rows_of(plan, "plan");
  std::string chosen;
  for (const json& r : summary)
    if (chosen.empty()) chosen = text(r, "chosen_as");
  html += fmt::format(
      "<h2>Per accelerator</h2>\n<p>Each accelerator's row is {} of its chip counts. time and cost: steps x step time; "
      "time* and cost*: adjusted for the goodput left by failures, restarts and checkpoints.</p>\n",
      chosen.empty() ? "the best" : escape(chosen));
  html += rows_table(summary, "summary");

  const auto per_chip = [](const json& r) { return num(r, {"tokens_per_second"}) / num(r, {"chips"}); };
  const json& strong = rows_of(plan, "strong_scaling");
  // The run's time in days, or in hours when every run is shorter than two days.
  double longest = 0;
  for (const json& r : strong)
    if (const double t = num(r, {"run", "seconds"}); std::isfinite(t)) longest = std::max(longest, t);
  const bool hours = longest < 2 * 86400;
  const std::string unit = hours ? "hours" : "days";
  const double unit_s = hours ? 3600 : 86400;
  html += fmt::format("<h2>Strong scaling</h2>\n<p>The global batch of {} sequences split over more chips.</p>\n",
                      escape(text(plan, "batch")));
  html += charts(strong, {{"strong-step", "Step time", "seconds per step", true,
                           [](const json& r) { return num(r, {"step_seconds"}); }, format_duration, false},
                          {"strong-tokens", "Tokens/s per chip (flat: perfect scaling)", "tokens/s per chip", false,
                           per_chip, [](double v) { return fmt::format("{:.4g} tokens/s per chip", v); }, true},
                          {"strong-days", "Time to train, goodput-adjusted", unit, true,
                           [unit_s](const json& r) {
                             return num(r, {"run", "seconds"}) / unit_s;
                           },
                           [unit](double v) { return fmt::format("{:.3g} {}", v, unit); }, false},
                          {"strong-dollars", "Cost of the run, goodput-adjusted", "dollars", false,
                           [](const json& r) {
                             return num(r, {"run", "dollars"});
                           },
                           format_dollars, false}});

  const json& weak = rows_of(plan, "weak_scaling");
  if (!weak.empty()) {
    const json& first = weak.front();
    html += fmt::format("<h2>Weak scaling</h2>\n<p>The batch grows with the chips: {} sequences per {} chips.</p>\n",
                        escape(text(first, "global_batch").empty() ? text(plan, "batch") : text(first, "global_batch")),
                        escape(text(first, "chips")));
    html += charts(weak, {{"weak-step", "Step time (flat: perfect scaling)", "seconds per step", false,
                           [](const json& r) { return num(r, {"step_seconds"}); }, format_duration, false}});
  }
  html += "<details><summary>Every strong-scaling row</summary>\n" + rows_table(strong, "strong-rows");
  if (!weak.empty()) html += "<h3>Weak scaling</h3>\n" + rows_table(weak, "weak-rows");
  return html + "</details>\n</body></html>\n";
}

}  // namespace tessera::plan
