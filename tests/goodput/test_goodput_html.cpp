// The HTML report renders in headless Chromium (no network: the file has no external
// references) with its four charts; the screenshot is kept in the build directory
// (goodput_report.png next to goodput_report.html) for a person to look at.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "goodput/log_builder.h"
#include "headless_chromium.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/events.h"
#include "tessera/goodput/report.h"

namespace tessera::goodput {
namespace {

namespace fs = std::filesystem;

// Per-rank records of 3 ranks over 40 steps; rank 2 is slow on every 7th step.
StragglerReport three_ranks_rank_2_slow() {
  std::vector<EventLog> logs;
  for (int rank = 0; rank < 3; ++rank) {
    testing::LogBuilder log;
    log.event(0, "rank_start", {{"rank", rank}, {"world_size", 3}, {"attempt", 0}});
    for (int step = 1; step <= 40; ++step) {
      const double slow = rank == 2 && step % 7 == 0 ? 0.3 : 0.01 * rank;
      log.event(step + 1, "rank_step",
                {{"rank", rank}, {"attempt", 0}, {"step", step}, {"start", step}, {"end", step + 1 + slow}});
    }
    logs.push_back(parse_event_log(log.text(), "events.rank-" + std::to_string(rank) + ".jsonl"));
  }
  return compute_stragglers(logs, {{0, 0.0}});
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

TEST(GoodputHtml, RendersInHeadlessChromiumWithItsCharts) {
  if (!fs::exists(chromium_test::kChromium))
    GTEST_SKIP() << "chromium not installed at /usr/bin/chromium (make deps installs it)";

  GoodputReport r =
      compute_goodput(read_event_log(fs::path(TESSERA_SOURCE_DIR) / "tests/goodput/fixtures/restarts_run.jsonl"));
  r.stragglers = three_ranks_rank_2_slow();
  std::vector<MetricPoint> metrics;
  for (int s = 0; s < 240; ++s) metrics.push_back({s, 10.0 / (1.0 + 0.05 * s) + 1.5});
  const std::string html = render_html(r, metrics, "goodput: restarts_run fixture");
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // only the SVG namespace
  EXPECT_EQ(html.find("<script"), std::string::npos);

  const chromium_test::ChromiumRender page = chromium_test::render_in_chromium(html, "goodput_report", 1200, 1600);
  ASSERT_EQ(page.screenshot_status, 0) << "chromium --screenshot failed";
  const std::string& bytes = page.png;
  ASSERT_GT(bytes.size(), 24u) << page.png_path;
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  EXPECT_EQ(chromium_test::be32(bytes, 16), 1200u);  // IHDR width, height
  EXPECT_EQ(chromium_test::be32(bytes, 20), 1600u);
  // A blank 1200x1600 page compresses to under 10 KB; charts in many colours do not.
  EXPECT_GT(bytes.size(), 30000u) << "screenshot looks blank";
  ASSERT_EQ(page.dom_status, 0) << "chromium --dump-dom failed";
  const std::string& dom = page.dom;
  for (const char* id : {"id=\"timeline\"", "id=\"breakdown\"", "id=\"step-time\"", "id=\"loss\"", "id=\"stragglers\"",
                         "id=\"straggler-excess\""})
    EXPECT_NE(dom.find(id), std::string::npos) << id << " missing from the rendered DOM";
  EXPECT_GT(count(dom, "class=\"seg\""), 10u);          // timeline segments
  EXPECT_EQ(count(dom, "class=\"attempt\""), 3u);       // one bar per attempt
  EXPECT_GT(count(dom, "class=\"bar\""), 5u);           // badput categories
  EXPECT_GT(count(dom, "<circle"), 200u);               // step times
  EXPECT_NE(dom.find("<polyline"), std::string::npos);  // loss curve
  EXPECT_EQ(count(dom, "class=\"rank-row\""), 3u);      // straggler table: a row per rank
  EXPECT_EQ(count(dom, "class=\"worst-step\""), 5u);    // and the five worst steps
  std::printf("[goodput html] screenshot: %s (%zu bytes)\n", page.png_path.c_str(), bytes.size());
}

TEST(GoodputHtml, MetricsReaderSkipsBadLines) {
  const fs::path path = fs::temp_directory_path() / ("tessera_metrics_" + std::to_string(::getpid()) + ".jsonl");
  // The validation-only record (what the trainer writes last) is neither a point nor a warning.
  std::ofstream(path) << "{\"step\":1,\"loss\":2.5,\"lr\":0.1}\nnot json\n{\"step\":2}\n{\"step\":3,\"loss\":2.0}\n"
                      << "{\"step\":3,\"val_loss\":2.1,\"final\":true}\n";
  std::vector<std::string> warnings;
  const std::vector<MetricPoint> points = read_metrics(path, &warnings);
  fs::remove(path);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[1].step, 3);
  EXPECT_DOUBLE_EQ(points[1].loss, 2.0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(":2: 2 lines"), std::string::npos) << warnings[0];
  EXPECT_TRUE(read_metrics("/nonexistent/metrics.jsonl", &warnings).empty());
}

// A log whose times span more hours than an int holds (damage, or a clock jump) prints
// its total, not an overflowed cast (found by fuzz_goodput_log).
TEST(GoodputHtml, TableShowsHugeSpans) {
  const GoodputReport report = compute_goodput(parse_event_log(
      "{\"v\":1,\"t\":0,\"type\":\"job_start\"}\n{\"v\":1,\"t\":1e15,\"type\":\"job_end\",\"ok\":true}\n", "x"));
  ASSERT_DOUBLE_EQ(report.total_s, 1e15);
  const std::string table = format_table(report);
  EXPECT_NE(table.find("of 277777777777h46m ("), std::string::npos) << table;
  EXPECT_NE(render_html(report, {}, "huge").find("277777777777h46m"), std::string::npos);
}

// A step that int64 cannot hold is a bad line, not a cast with undefined behaviour
// (found by fuzz_goodput_log); a float step that it holds still counts.
TEST(GoodputHtml, MetricsReaderSkipsStepsOutOfRange) {
  const fs::path path = fs::temp_directory_path() / ("tessera_metrics_big_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(path) << "{\"step\":1e300,\"loss\":2.5}\n{\"step\":-1e19,\"loss\":2.5}\n{\"step\":4.0,\"loss\":1.5}\n"
                      << "{\"step\":true,\"loss\":1.0}\n";
  std::vector<std::string> warnings;
  const std::vector<MetricPoint> points = read_metrics(path, &warnings);
  fs::remove(path);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].step, 4);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(":1: 3 lines without a numeric \"step\" and finite \"loss\"; skipped"), std::string::npos)
      << warnings[0];
}

}  // namespace
}  // namespace tessera::goodput
