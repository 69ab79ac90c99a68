// The page of `tessera plan --html`: built from a plan JSON written here (the object
// `tessera plan --json` prints), its structure checked, and rendered in headless
// Chromium (no network: the page has no external references). The screenshot is kept
// in the build directory (plan_report.png next to plan_report.html) for a person to
// look at.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "headless_chromium.h"
#include "tessera/plan/report_html.h"

namespace tessera::plan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A row as row_json in src/cli/command_plan.cpp writes it; the step time halves with
// the chips until communication (a tenth of the step at 8 chips) stops shrinking.
json row(const std::string& accelerator, int chips, double step_at_8, bool fits = true) {
  const double step = step_at_8 * (0.9 * 8 / chips + 0.1), tokens = 1e10, steps = tokens / (512.0 * 1024);
  const double goodput = 0.97 - 0.002 * chips, raw = steps * step;
  const double price = accelerator == "h100" ? 3.0 : 4.2;
  return {{"accelerator", accelerator},
          {"chips", chips},
          {"found", true},
          {"reason", fits ? "" : "optimizer state 61.2 GB of 80 GB; fits with fsdp=16"},
          {"mesh", chips == 8 ? "data=8" : "data=" + std::to_string(chips / 8) + ",fsdp=8"},
          {"global_batch", 512},
          {"seq", 1024},
          {"micro_batches", 1},
          {"step_seconds", step},
          {"mfu", 0.45 * step_at_8 * 8 / chips / step},
          {"tokens_per_second", 512.0 * 1024 / step},
          {"memory", {{"peak", fits ? 40e9 : 95e9}, {"capacity", 80e9}, {"fits", fits}}},
          {"run",
           {{"tokens", tokens},
            {"steps", steps},
            {"raw_seconds", raw},
            {"goodput", goodput},
            {"seconds", raw / goodput},
            {"mtbf_seconds", nullptr},
            {"dollars_raw", raw / 3600 * chips * price},
            {"dollars", raw / goodput / 3600 * chips * price}}}};
}

json not_found(const std::string& accelerator, int chips) {
  return {{"accelerator", accelerator},
          {"chips", chips},
          {"found", false},
          {"reason", "no layout of 32 chips divides the micro-batch"}};
}

// Two accelerators at 8, 16 and 32 chips: h100 does not fit at 8, tpu<&> has no layout
// at 32 (its name checks the escaping).
json two_accelerators() {
  json plan{{"model", "gpt2-124m"}, {"parameters", 124439808},     {"batch", 512},
            {"seq", 1024},          {"compute_dtype", "bfloat16"}, {"remat", "none"},
            {"tokens", 1e10},       {"restart_seconds", 600},      {"save_seconds", 10}};
  json h100_16 = row("h100", 16, 1.0);
  h100_16["chosen_as"] = "the cheapest (goodput-adjusted)";
  json tpu_8 = row("tpu<&>", 8, 0.8);
  tpu_8["chosen_as"] = "the cheapest (goodput-adjusted)";
  plan["plan"] = json::array({h100_16, tpu_8});
  plan["strong_scaling"] = json::array({row("h100", 8, 1.0, false), h100_16, row("h100", 32, 1.0), tpu_8,
                                        row("tpu<&>", 16, 0.8), not_found("tpu<&>", 32)});
  // Weak scaling: 64 sequences per chip, the step a little longer at each doubling.
  json weak = json::array();
  for (const char* acc : {"h100", "tpu<&>"})
    for (int chips : {8, 16, 32}) {
      json r = row(acc, chips, 1.0);
      r["global_batch"] = 64 * chips;
      r["step_seconds"] = (acc == std::string("h100") ? 0.55 : 0.8) * (1 + 0.004 * chips);
      weak.push_back(r);
    }
  plan["weak_scaling"] = weak;
  return plan;
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

TEST(PlanHtml, ChartsAndTablesOfEveryAccelerator) {
  const std::string html = render_plan_html(two_accelerators(), "plan <of> gpt2 & co");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http"), html.find("http://www.w3.org/2000/svg"));  // only the SVG namespace
  EXPECT_EQ(count(html, "http"), count(html, "<svg"));
  EXPECT_EQ(html.find("tpu<&>"), std::string::npos);  // every string escaped
  EXPECT_NE(html.find("<h1>plan &lt;of&gt; gpt2 &amp; co</h1>"), std::string::npos);

  // Five charts: strong step, tokens/s per chip, days, dollars; weak step.
  for (const char* id : {"strong-step", "strong-tokens", "strong-days", "strong-dollars", "weak-step"})
    EXPECT_NE(html.find(std::string("<svg id=\"") + id + "\""), std::string::npos) << id;
  EXPECT_EQ(count(html, "<svg"), 5u);
  EXPECT_NE(html.find(">hours (log scale)</text>"), std::string::npos);  // runs under two days: hours
  // Both accelerators in every legend.
  EXPECT_EQ(count(html, "class=\"legend\" "), 10u);
  EXPECT_EQ(count(html, ">h100</text>"), 5u);
  EXPECT_EQ(count(html, ">tpu&lt;&amp;&gt;</text>"), 5u);
  // Strong charts: each accelerator's two fitting rows joined (h100 16, 32; tpu 8, 16),
  // h100 at 8 hollow, tpu at 32 not drawn. Weak: both lines of three points.
  EXPECT_EQ(count(html, "<polyline"), 4u * 2 + 2);
  EXPECT_EQ(count(html, "class=\"pt\""), 4u * 4 + 6);
  EXPECT_EQ(count(html, "class=\"pt-open\""), 4u);
  EXPECT_NE(html.find("does not fit</text>"), std::string::npos);  // the hollow marker's legend entry
  // And the two rows the charts cannot draw filled, with the planner's reasons.
  EXPECT_NE(html.find("<li>h100 x8: does not fit in memory (hollow marker): optimizer state 61.2 GB"),
            std::string::npos);
  EXPECT_NE(html.find("<li>tpu&lt;&amp;&gt; x32: no valid layout (not drawn): no layout of 32 chips"),
            std::string::npos);

  // The summary: a row per accelerator, the job in the header.
  const size_t summary = html.find("<table id=\"summary\">");
  ASSERT_NE(summary, std::string::npos);
  const std::string table = html.substr(summary, html.find("</table>", summary) - summary);
  EXPECT_EQ(count(table, "<tr>"), 3u);  // header and two rows
  EXPECT_NE(table.find("40.0 / 80 GB, fits"), std::string::npos);
  EXPECT_NE(html.find("<p id=\"job\"><b>gpt2-124m</b> &middot; 124.4M parameters &middot; batch 512 x 1024"),
            std::string::npos);
  EXPECT_NE(html.find("95.0 / 80 GB, <b>over by 15.0 GB</b>"), std::string::npos);  // in the full table
}

// A plan where nothing has a value (every row not found, infinities written as null)
// still renders, with the charts saying so.
TEST(PlanHtml, RowsWithoutValues) {
  json plan = two_accelerators();
  plan["strong_scaling"] = json::array({not_found("h100", 8)});
  plan["weak_scaling"] = json::array();
  plan["plan"] = json::array({{{"accelerator", "h100"}, {"found", false}}});
  plan["tokens"] = nullptr;
  const std::string html = render_plan_html(plan, "empty");
  EXPECT_EQ(count(html, "no row has a value to draw"), 4u);
  EXPECT_EQ(html.find("weak-step"), std::string::npos);
  EXPECT_NE(html.find("no chip count in the range fits"), std::string::npos);
  EXPECT_NE(html.find("&middot; - tokens to train on"), std::string::npos);
}

TEST(PlanHtml, Units) {
  EXPECT_EQ(format_duration(0.0123), "12.3 ms");
  EXPECT_EQ(format_duration(4.5), "4.50 s");
  EXPECT_EQ(format_duration(3 * 3600), "3.0 h");
  EXPECT_EQ(format_duration(12.4 * 86400), "12.4 d");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "-");
  EXPECT_EQ(format_dollars(812.4), "$812.40");
  EXPECT_EQ(format_dollars(12345), "$12.3k");
  EXPECT_EQ(format_dollars(1.25e6), "$1.25M");
}

TEST(PlanHtml, RendersInHeadlessChromium) {
  if (!fs::exists(chromium_test::kChromium))
    GTEST_SKIP() << "chromium not installed at /usr/bin/chromium (make deps installs it)";
  const chromium_test::ChromiumRender page = chromium_test::render_in_chromium(
      render_plan_html(two_accelerators(), "tessera plan: gpt2-124m"), "plan_report", 1200, 1500);
  ASSERT_EQ(page.screenshot_status, 0) << "chromium --screenshot failed";
  const std::string& bytes = page.png;
  ASSERT_GT(bytes.size(), 24u) << page.png_path;
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  // A blank 1200x1500 page compresses to under 10 KB; tables and coloured charts do not.
  EXPECT_GT(bytes.size(), 30000u) << "screenshot looks blank";
  ASSERT_EQ(page.dom_status, 0) << "chromium --dump-dom failed";
  const std::string& dom = page.dom;
  EXPECT_EQ(count(dom, "<svg"), 5u);  // the parser kept every chart
  EXPECT_EQ(count(dom, "<polyline"), 10u);
  std::printf("[plan html] screenshot: %s (%zu bytes)\n", page.png_path.c_str(), bytes.size());
}

}  // namespace
}  // namespace tessera::plan
