// Pipeline schedules: every schedule runs each (micro-batch, stage) forward and
// backward once on the stage's device and can finish; replayed with a backward twice a
// forward, its idle share is the analytic bubble ((p-1)/(m+p-1), interleaved
// (p-1)/(v m+p-1)); 1F1B holds at most p-d micro-batches on device d where GPipe holds
// all m; the stage balance; the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "spmd/spmd_test_util.h"
#include "tessera/base/error.h"
#include "tessera/train/pipeline_schedule.h"

namespace tessera::train {
namespace {

struct Shape {
  PipelineKind kind;
  int p, m, v;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8, 16}) {
      out.push_back({PipelineKind::kGPipe, p, m, 1});
      out.push_back({PipelineKind::kOneFOneB, p, m, 1});
      for (int v : {2, 3})
        if (m % p == 0) out.push_back({PipelineKind::kInterleaved, p, m, v});
    }
  return out;
}

TEST(PipelineSchedule, EveryOpRunsOnceOnItsStagesDevice) {
  for (const Shape& sh : shapes()) {
    const PipelineSchedule s = make_pipeline_schedule(sh.kind, sh.p, sh.m, sh.v);
    const std::string what = fmt::format("{} p={} m={} v={}", to_string(sh.kind), sh.p, sh.m, sh.v);
    std::set<std::tuple<bool, int, int>> seen;
    for (int d = 0; d < sh.p; ++d) {
      EXPECT_EQ(s.ops[d].size(), static_cast<size_t>(2 * sh.m * sh.v)) << what;
      for (const PipelineOp& op : s.ops[d]) {
        EXPECT_EQ(op.stage % sh.p, d) << what;
        EXPECT_TRUE(seen.insert({op.forward, op.micro_batch, op.stage}).second) << what << ": an op twice";
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(2 * sh.m * sh.p * sh.v)) << what;
  }
}

TEST(PipelineSchedule, MeasuredBubbleIsTheAnalyticOne) {
  for (const Shape& sh : shapes()) {
    const PipelineSchedule s = make_pipeline_schedule(sh.kind, sh.p, sh.m, sh.v);
    const PipelineTimeline t = simulate(s, 1, 2);  // a backward costs two forwards
    const double analytic = analytic_bubble_fraction(s);
    const std::string what = fmt::format("{} p={} m={} v={}: measured {:.4f} analytic {:.4f}", to_string(sh.kind), sh.p,
                                         sh.m, sh.v, t.bubble_fraction, analytic);
    // The bar is 5%; with uniform stage costs the replay is exact.
    EXPECT_NEAR(t.bubble_fraction, analytic, 1e-9) << what;
    EXPECT_DOUBLE_EQ(t.busy, sh.p * sh.m * sh.v * 3.0) << what;
  }
  // A p=4, m=8 1F1B step: (4-1)/(8+4-1) = 27.3% idle; interleaving 2 virtual stages
  // halves the warm-up: 3/19 = 15.8%.
  EXPECT_NEAR(simulate(make_pipeline_schedule(PipelineKind::kOneFOneB, 4, 8)).bubble_fraction, 3.0 / 11, 1e-12);
  EXPECT_NEAR(simulate(make_pipeline_schedule(PipelineKind::kInterleaved, 4, 8, 2)).bubble_fraction, 3.0 / 19, 1e-12);
}

TEST(PipelineSchedule, OneFOneBHoldsTheDepthWhereGPipeHoldsEveryMicroBatch) {
  for (int p : {2, 4})
    for (int m : {4, 8, 16}) {
      const PipelineTimeline gpipe = simulate(make_pipeline_schedule(PipelineKind::kGPipe, p, m));
      const PipelineTimeline one_f = simulate(make_pipeline_schedule(PipelineKind::kOneFOneB, p, m));
      for (int d = 0; d < p; ++d) {
        EXPECT_EQ(gpipe.peak_in_flight[d], m) << "gpipe p=" << p << " m=" << m << " device " << d;
        EXPECT_EQ(one_f.peak_in_flight[d], std::min(p - d, m)) << "1f1b p=" << p << " m=" << m << " device " << d;
      }
      // Same bubble, far less memory once m exceeds p.
      EXPECT_NEAR(gpipe.bubble_fraction, one_f.bubble_fraction, 1e-12);
    }
  // Interleaved: device d's warm-up, 2(p-d-1) + (v-1)p virtual stages, plus the one
  // forward before the first backward. Each is 1/v of a stage's layers: device 0 of
  // p=4, v=2 holds 11 halves, 5.5 stages' worth against 1F1B's 4 (Megatron-LM's price for
  // the smaller bubble).
  const PipelineTimeline inter = simulate(make_pipeline_schedule(PipelineKind::kInterleaved, 4, 8, 2));
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(inter.peak_in_flight[d], 2 * (4 - d - 1) + 4 + 1) << "interleaved device " << d;
  }
}

TEST(PipelineSchedule, SlowLinksLengthenTheStepAndEveryOpWaitsForItsInputs) {
  const PipelineSchedule s = make_pipeline_schedule(PipelineKind::kInterleaved, 4, 8, 2);
  const double hop = 0.5;
  const PipelineTimeline ideal = simulate(s, 1, 2, 0), slow_links = simulate(s, 1, 2, hop);
  EXPECT_GT(slow_links.makespan, ideal.makespan);
  EXPECT_GT(slow_links.bubble_fraction, ideal.bubble_fraction);
  std::map<std::tuple<bool, int, int>, double> ends;
  for (const auto& slots : slow_links.devices)
    for (const auto& slot : slots) ends[{slot.op.forward, slot.op.micro_batch, slot.op.stage}] = slot.end;
  auto end_of = [&](bool forward, int micro_batch, int stage) { return ends.at({forward, micro_batch, stage}); };
  for (const auto& slots : slow_links.devices)
    for (const auto& slot : slots) {
      const PipelineOp& op = slot.op;
      if (op.forward && op.stage > 0) {
        EXPECT_GE(slot.start, end_of(true, op.micro_batch, op.stage - 1) + hop);
      }
      if (!op.forward) {
        EXPECT_GE(slot.start, end_of(true, op.micro_batch, op.stage));
        if (op.stage < s.stages() - 1) {
          EXPECT_GE(slot.start, end_of(false, op.micro_batch, op.stage + 1) + hop);
        }
      }
    }
}

TEST(PipelineSchedule, TheTimelineShowsEachDevicesOps) {
  const PipelineSchedule s = make_pipeline_schedule(PipelineKind::kOneFOneB, 2, 4);
  const std::string text = render_timeline(simulate(s), s);
  std::printf("%s", text.c_str());
  EXPECT_NE(text.find("device  0 |F0 F1 .. .. B0 -- F2 B1 -- F3 B2 -- .. B3 --|"), std::string::npos) << text;
  EXPECT_NE(text.find("device  1 |.. F0 B0 -- F1 B1 -- F2 B2 -- F3 B3 -- .. ..|"), std::string::npos) << text;
  EXPECT_NE(text.find("1f1b over 2 devices, 4 micro-batches: bubble 20.0% (analytic 20.0%), peak in flight 2/1"),
            std::string::npos)
      << text;
  const PipelineSchedule inter = make_pipeline_schedule(PipelineKind::kInterleaved, 2, 4, 2);
  EXPECT_NE(render_timeline(simulate(inter), inter).find("F0:1"), std::string::npos);
}

TEST(PipelineSchedule, AnOrderThatCannotFinishIsNamed) {
  PipelineSchedule s = make_pipeline_schedule(PipelineKind::kOneFOneB, 2, 2);
  std::swap(s.ops[1][0], s.ops[1][1]);  // device 1 runs B0 before F0
  try {
    simulate(s);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot finish: device 0 waits at B0 of stage 0 (its op 2); device 1 waits at "
                                         "B0 of stage 1 (its op 0)"),
              std::string::npos)
        << e.what();
  }
}

TEST(PipelineSchedule, BadShapesAreClearErrors) {
  EXPECT_THROW(parse_pipeline_kind("zero-bubble"), ConfigError);
  EXPECT_EQ(parse_pipeline_kind("interleaved"), PipelineKind::kInterleaved);
  auto message = [](auto&& fn) { return testing::error_of<ValueError>(fn); };
  EXPECT_NE(message([] {
              make_pipeline_schedule(PipelineKind::kInterleaved, 4, 6, 2);
            }).find("a multiple of the pipeline devices (6 micro-batches, 4 devices)"),
            std::string::npos);
  EXPECT_NE(
      message([] { make_pipeline_schedule(PipelineKind::kInterleaved, 4, 8, 1); }).find("at least 2 virtual stages"),
      std::string::npos);
  EXPECT_NE(message([] {
              make_pipeline_schedule(PipelineKind::kOneFOneB, 4, 8, 2);
            }).find("2 virtual stages per device need the interleaved schedule"),
            std::string::npos);
  EXPECT_NE(message([] { make_pipeline_schedule(PipelineKind::kGPipe, 0, 8); }).find("0 devices"), std::string::npos);
  EXPECT_NE(message([] { make_pipeline_schedule(PipelineKind::kGPipe, 2, 0); }).find("0 micro-batches"),
            std::string::npos);
}

TEST(PipelineSchedule, StagesBalanceContiguousLayersByCost) {
  using Split = std::vector<std::pair<int, int>>;
  EXPECT_EQ(balance_stages(std::vector<double>(8, 1.0), 4), (Split{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  // 5 equal layers over 2 stages: the first stage takes the lighter share (device 0
  // holds the most micro-batches under 1F1B).
  EXPECT_EQ(balance_stages(std::vector<double>(5, 1.0), 2), (Split{{0, 2}, {2, 5}}));
  // An expensive layer (an output head) gets a stage of its own.
  EXPECT_EQ(balance_stages({1, 1, 1, 1, 1, 1, 6}, 2), (Split{{0, 6}, {6, 7}}));
  EXPECT_EQ(balance_stages({3, 1, 1, 1, 3}, 3), (Split{{0, 1}, {1, 4}, {4, 5}}));
  try {
    balance_stages({1, 1, 1}, 4);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("3 layers cannot fill 4 stages"), std::string::npos) << e.what();
  }
  EXPECT_THROW(balance_stages({1, -1}, 1), ValueError);
}

}  // namespace
}  // namespace tessera::train
