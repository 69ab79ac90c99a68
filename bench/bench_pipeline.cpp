// bench_pipeline: a GPT training step under pipeline layouts (train/pipeline_step.h:
// device threads of this process) against the same step on one device: step time,
// the devices' measured idle share (the bubble) against the schedule's analytic value,
// the bytes handed between stages against the analytic count, and the micro-batches
// each device holds at once (1F1B bounds them by the depth, GPipe by m).
//
//   build/bin/bench_pipeline [--preset tiny] [--layers 8] [--batch 16] [--seq 128] [--rounds 5]
//                            [--layouts 1f1b:2:4;1f1b:2:4+keep;gpipe:2:4;interleaved:2:4:2;1f1b:2:4@tensor=2]
//
// A layout is schedule:p:m[:v][+keep][@axes] (p pipeline devices, m micro-batches, v
// virtual stages; +keep: the stages keep their forwards' activations instead of
// recomputing them, PipelineOptions::recompute = false; @tensor=2 or @fsdp=2,tensor=2:
// each stage partitioned over those mesh axes, PipelineOptions::mesh, on virtual devices
// of the SPMD runtime).
// Rounds are interleaved: each round runs one step of every layout (and of one device)
// in turn, and the figures are medians over rounds, so a machine that slows down slows
// every layout alike. A layout with more device threads than this machine's cores is
// run and printed but marked "shared cores": its threads take turns on the cores, so its
// idle time is not the schedule's, and bubble_vs_analytic_max leaves it out.
//
// Analytic bytes: each of the m micro-batches crosses each of the S - 1 stage boundaries
// twice (its activations forward, their gradient backward), [batch / m, seq, dim] float32
// each time: 2 (S - 1) batch seq dim 4 bytes (times the stage devices that hold the same
// rows, for partitioned stages). The collectives inside partitioned stages against
// PipelineTrainStep::analytic_collective_bytes (train/parallel.h's count for a stage whose
// backward recomputes its forward, or keeps its activations and gathers the weights it
// reads again with +keep; scalar reductions of the loss not counted). The last
// line is one JSON object with every figure, comm_bytes_vs_analytic_max (the worst ratio
// of measured to analytic bytes, hand-overs and in-stage collectives) and
// bubble_vs_analytic_max (the largest |measured - analytic| idle share).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/parallel.h"
#include "tessera/train/pipeline_step.h"
#include "tessera/train/train_step.h"
#include "train_bench_util.h"

namespace ts = tessera;

namespace {

using Clock = std::chrono::steady_clock;

struct Layout {
  ts::train::PipelineKind kind = ts::train::PipelineKind::kOneFOneB;
  int devices = 2, micro_batches = 4, virtual_stages = 1;
  bool keep = false;   // activations kept for the backward (no recompute)
  std::string inside;  // "tensor=2": the axes each stage is partitioned over ("": none)
  std::string name() const {
    return fmt::format("{} p={} m={}{}{}{}", ts::train::to_string(kind), devices, micro_batches,
                       virtual_stages > 1 ? fmt::format(" v={}", virtual_stages) : "", keep ? " keep" : "",
                       inside.empty() ? "" : " @" + inside);
  }
  ts::spmd::Mesh mesh() const {
    return inside.empty() ? ts::spmd::Mesh() : ts::spmd::Mesh::parse(fmt::format("pipeline={},{}", devices, inside));
  }
};

struct Flags {
  std::string preset = "tiny";
  int64_t layers = 8, batch = 16, seq = 128, rounds = 5;
  std::vector<Layout> layouts;
};

Layout parse_layout(const std::string& layout_text) {
  const size_t at = layout_text.find('@');
  std::string text = layout_text.substr(0, at);
  const bool keep = text.ends_with("+keep");
  if (keep) text = text.substr(0, text.size() - 5);
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(':', start), text.size());
    parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  if (parts.size() < 3 || parts.size() > 4)
    ts::fail<ts::ValueError>("bench_pipeline: layout '{}' is not schedule:p:m[:v]", text);
  Layout l;
  l.kind = ts::train::parse_pipeline_kind(parts[0]);
  l.devices = std::stoi(parts[1]);
  l.micro_batches = std::stoi(parts[2]);
  l.virtual_stages = parts.size() == 4 ? std::stoi(parts[3]) : 1;
  l.keep = keep;
  if (at != std::string::npos) l.inside = layout_text.substr(at + 1);
  return l;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  std::string layouts =
      "gpipe:2:4;1f1b:2:4;1f1b:2:4+keep;1f1b:2:8;1f1b:2:8+keep;interleaved:2:4:2;interleaved:2:4:2+keep;1f1b:4:8;"
      "interleaved:4:8:2;1f1b:2:4@tensor=2;1f1b:2:4+keep@tensor=2;1f1b:2:4@fsdp=2;1f1b:2:4+keep@fsdp=2;"
      "1f1b:2:4@fsdp=2,tensor=2";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--preset")
      f.preset = value;
    else if (arg == "--layers")
      f.layers = std::stoll(value);
    else if (arg == "--batch")
      f.batch = std::stoll(value);
    else if (arg == "--seq")
      f.seq = std::stoll(value);
    else if (arg == "--rounds")
      f.rounds = std::max<int64_t>(1, std::stoll(value));
    else if (arg == "--layouts")
      layouts = value;
    else
      ts::fail<ts::ValueError>("bench_pipeline: unknown flag {}", arg);
  }
  size_t start = 0;
  while (start <= layouts.size()) {
    const size_t end = std::min(layouts.find(';', start), layouts.size());
    if (end > start) f.layouts.push_back(parse_layout(layouts.substr(start, end - start)));
    start = end + 1;
  }
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Result {
  Layout layout;
  bool shared_cores = false;
  std::vector<double> step_ms, bubble;
  double analytic_bubble = 0, sent_bytes = 0, analytic_bytes = 0, loss = 0;
  double collective_bytes = 0, analytic_collective_bytes = 0;  // inside partitioned stages
  std::vector<int> peak_in_flight;
  std::string stages;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse_flags(argc, argv);
    ts::models::ModelConfig mc = ts::models::preset(f.preset);
    mc.layers = f.layers;
    mc.context = std::max(mc.context, f.seq);
    const ts::models::Model model(mc);
    const ts::optim::Optimizer optimizer(ts::optim::OptimizerConfig{}, model.specs());
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

    // One device (the reference), then every layout: each with its own parameters.
    ts::train::TrainStep one(model, optimizer, 1);
    ts::Tree one_params = model.init(1), one_opt = optimizer.init(one_params);  // donated: a tree each
    std::vector<double> one_ms;
    std::vector<ts::train::PipelineTrainStep> steps;
    std::vector<ts::Tree> params, opts;
    std::vector<Result> results;
    int most_devices = 1;  // partitioned stages run on the SPMD runtime's virtual devices
    for (const Layout& l : f.layouts) most_devices = std::max(most_devices, l.mesh().size());
    if (most_devices > ts::spmd::device_count()) ts::spmd::set_cpu_devices(most_devices);
    for (const Layout& l : f.layouts) {
      ts::train::PipelineOptions o;
      o.kind = l.kind;
      o.devices = l.devices;
      o.micro_batches = l.micro_batches;
      o.virtual_stages = l.virtual_stages;
      o.mesh = l.mesh();
      o.recompute = !l.keep;
      steps.emplace_back(model, optimizer, 1, o, 1, f.seq);
      params.push_back(model.init(1));
      opts.push_back(optimizer.init(params.back()));
      Result r;
      r.layout = l;
      const int per_stage = l.inside.empty() ? 1 : l.mesh().size() / l.devices;
      r.shared_cores = static_cast<unsigned>(l.devices * per_stage) > cores;
      r.analytic_bubble = ts::train::analytic_bubble_fraction(steps.back().schedule());
      const int stages = l.devices * l.virtual_stages;
      // A partitioned stage's devices each send their part: the rows split over the batch
      // axes, whole over the others (tensor).
      const double copies =
          l.inside.empty()
              ? 1
              : static_cast<double>(per_stage) /
                    static_cast<double>(ts::train::Layout(l.mesh(), ts::train::default_axis_rules(), model.specs())
                                            .data_parallel_size());
      r.analytic_bytes = 2.0 * (stages - 1) * static_cast<double>(f.batch * f.seq * mc.dim) * 4 * copies;
      r.analytic_collective_bytes = steps.back().analytic_collective_bytes(f.batch, f.seq);
      for (const auto& [first, last] : steps.back().stage_layers())
        r.stages += fmt::format("{}{}-{}", r.stages.empty() ? "" : ",", first, last - 1);
      results.push_back(r);
    }
    for (int64_t round = 0; round <= f.rounds; ++round) {  // round 0 compiles and warms up
      std::mt19937_64 gen(static_cast<uint64_t>(round));
      const std::vector<ts::data::Batch> batch{ts::bench::random_batch(mc.vocab, f.batch, f.seq, gen)};
      auto t0 = Clock::now();
      one.run(one_params, one_opt, batch, 1e-4, std::nullopt);
      if (round > 0) one_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      for (size_t i = 0; i < steps.size(); ++i) {
        t0 = Clock::now();
        const ts::train::StepStats stats = steps[i].run(params[i], opts[i], batch, 1e-4);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (round == 0) continue;
        Result& r = results[i];
        r.step_ms.push_back(ms);
        r.bubble.push_back(steps[i].last_bubble_fraction());
        r.sent_bytes = steps[i].last_sent_bytes();
        r.collective_bytes = steps[i].last_collective_bytes();
        r.loss = stats.loss;
        r.peak_in_flight = steps[i].last_timelines().front().peak_in_flight;
      }
    }

    const double one_median = median(one_ms);
    fmt::print(
        "bench_pipeline: GPT '{}' with {} layers, batch {} x seq {}, float32, median of {} interleaved rounds, "
        "{} cores; one device {:.1f} ms/step\n",
        f.preset, f.layers, f.batch, f.seq, f.rounds, cores, one_median);
    fmt::print("{:<34} {:<16} {:>8} {:>7} {:>8} {:>9} {:>7} {:>13} {:>13} {:>7} {:>13} {:>13} {:>7} {:>9}\n", "layout",
               "stages (layers)", "step ms", "vs one", "bubble", "analytic", "|diff|", "sent bytes", "analytic",
               "ratio", "in-stage coll", "analytic", "ratio", "in flight");
    double worst_bytes = 0, worst_bubble = 0;
    std::string json;
    for (const Result& r : results) {
      const double ms = median(r.step_ms), bubble = median(r.bubble);
      const double ratio = r.analytic_bytes > 0 ? r.sent_bytes / r.analytic_bytes : 0;
      const double diff = std::abs(bubble - r.analytic_bubble);
      const double collective_ratio =
          r.analytic_collective_bytes > 0 ? r.collective_bytes / r.analytic_collective_bytes : 0;
      worst_bytes = std::max({worst_bytes, ratio, collective_ratio});
      if (!r.shared_cores) worst_bubble = std::max(worst_bubble, diff);
      fmt::print(
          "{:<34} {:<16} {:>8.1f} {:>6.2f}x {:>7.1f}% {:>8.1f}% {:>7.3f} {:>13.0f} {:>13.0f} {:>7.4f} {:>13.0f} "
          "{:>13.0f} "
          "{:>7.4f} {:>9}{}\n",
          r.layout.name(), r.stages, ms, one_median / ms, 100 * bubble, 100 * r.analytic_bubble, diff, r.sent_bytes,
          r.analytic_bytes, ratio, r.collective_bytes, r.analytic_collective_bytes, collective_ratio,
          fmt::format("{}", fmt::join(r.peak_in_flight, "/")), r.shared_cores ? "  shared cores" : "");
      json += fmt::format(
          "{}{{\"layout\":\"{}\",\"stages\":\"{}\",\"step_ms\":{:.3f},\"speed_vs_one_device\":{:.4f},\"bubble\":{:.4f},"
          "\"analytic_bubble\":{:.4f},\"sent_bytes\":{:.0f},\"analytic_bytes\":{:.0f},\"stage_collective_bytes\":{:.0f}"
          ","
          "\"analytic_stage_collective_bytes\":{:.0f},\"peak_in_flight\":[{}],\"shared_cores\":{},\"loss\":{:.6f}}}",
          json.empty() ? "" : ",", r.layout.name(), r.stages, ms, one_median / ms, bubble, r.analytic_bubble,
          r.sent_bytes, r.analytic_bytes, r.collective_bytes, r.analytic_collective_bytes,
          fmt::join(r.peak_in_flight, ","), r.shared_cores, r.loss);
    }
    fmt::print(
        "{{\"bench\":\"pipeline\",\"preset\":\"{}\",\"layers\":{},\"batch\":{},\"seq\":{},\"rounds\":{},\"cores\":{},"
        "\"one_device_step_ms\":{:.3f},\"layouts\":[{}],\"comm_bytes_vs_analytic_max\":{:.6f},"
        "\"bubble_vs_analytic_max\":{:.4f}}}\n",
        f.preset, f.layers, f.batch, f.seq, f.rounds, cores, one_median, json, worst_bytes, worst_bubble);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_pipeline: {}\n", e.what());
    return 1;
  }
}
