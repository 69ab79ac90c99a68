// bench_spmd: a GPT training step under each parallel layout on N virtual CPU devices
// (one process, a thread per device): per-step collective calls and bytes per device
// (what the partitioner inserted, what the communicator measured, and the analytic
// count of train/parallel.h), time in collectives, step time, and per-device memory
// (parameters + optimizer state held, and the compiled program's peak).
//
//   build/bin/bench_spmd [--preset small] [--steps 3] [--batch 8] [--seq 128] [--layouts data=2,fsdp=2;...]
//                        [--rules vocab=tensor]
//
// The virtual devices share this machine's cores, so step time shows the partitioned
// program's overheads, not a multi-device speed-up. A table goes to stdout; the last
// line is one JSON object with every figure and comm_bytes_vs_analytic_max (the worst
// ratio of inserted to analytic bytes over the layouts).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/parallel.h"
#include "tessera/train/train_step.h"

namespace ts = tessera;

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string preset = "small";
  int64_t steps = 3, batch = 8, seq = 128;
  std::string rules;  // logical axis rules over the defaults (train/parallel.h)
  std::vector<std::string> layouts = {"",       "data=2",          "fsdp=2",          "tensor=2",
                                      "fsdp=4", "data=2,tensor=2", "fsdp=2,tensor=2", "data=2,fsdp=2,tensor=2"};
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--preset") {
      f.preset = value;
    } else if (arg == "--steps") {
      f.steps = std::max<int64_t>(1, std::stoll(value));
    } else if (arg == "--batch") {
      f.batch = std::stoll(value);
    } else if (arg == "--seq") {
      f.seq = std::stoll(value);
    } else if (arg == "--rules") {
      f.rules = value;
    } else if (arg == "--layouts") {
      f.layouts.clear();
      size_t start = 0;
      while (start <= value.size()) {
        size_t end = value.find(';', start);
        if (end == std::string::npos) end = value.size();
        f.layouts.push_back(value.substr(start, end - start));
        start = end + 1;
      }
    } else {
      ts::fail<ts::ValueError>("bench_spmd: unknown flag {}", arg);
    }
  }
  return f;
}

ts::data::Batch random_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(b * t)), targets(tokens.size());
  for (auto& x : tokens) x = u(rng);
  for (auto& x : targets) x = u(rng);
  return {ts::Array::from_vector(tokens, {b, t}), ts::Array::from_vector(targets, {b, t})};
}

// Bytes device 0 holds of a tree (its shards, or the whole arrays).
double bytes_on_device0(const ts::Tree& tree) {
  double bytes = 0;
  for (const ts::Array& a : tree.leaves()) {
    if (const ts::spmd::Sharding* s = ts::spmd::sharding_of(a))
      bytes += static_cast<double>(ts::numel(s->local_shape(a.shape()))) * static_cast<double>(a.itemsize());
    else
      bytes += static_cast<double>(a.nbytes());
  }
  return bytes;
}

struct Result {
  std::string mesh;
  double step_ms = 0, loss = 0;
  double inserted_bytes = 0, measured_bytes = 0, analytic_bytes = 0, comm_ms = 0;
  int64_t calls = 0;
  double state_bytes = 0, peak_bytes = 0;
};

Result run_layout(const Flags& f, const std::string& mesh_text) {
  ts::models::ModelConfig mc = ts::models::preset(f.preset);
  ts::models::Model model(mc);
  ts::optim::OptimizerConfig oc;
  ts::optim::Optimizer optimizer(oc, model.specs());
  ts::Tree params = model.init(1);
  ts::Tree opt = optimizer.init(params);
  std::optional<ts::train::Layout> layout;
  Result r;
  r.mesh = mesh_text.empty() ? "single" : mesh_text;
  if (!mesh_text.empty()) {
    ts::spmd::Mesh mesh = ts::spmd::Mesh::parse(mesh_text);
    ts::spmd::set_cpu_devices(mesh.size());
    layout.emplace(mesh, ts::train::parse_axis_rules(f.rules), model.specs());
    params = layout->shard_params(params);
    opt = layout->shard_opt_state(opt);
    r.analytic_bytes = layout->analytic_step_bytes(mc.layers, mc.dim, f.batch, f.seq);
  } else {
    ts::spmd::set_cpu_devices(1);
  }
  r.state_bytes = bytes_on_device0(params) + bytes_on_device0(opt);
  ts::train::TrainStep step(model, optimizer, 1, layout ? &*layout : nullptr);
  std::vector<double> times, comm;
  for (int64_t s = 0; s <= f.steps; ++s) {  // step 0 compiles and warms up
    ts::data::Batch b = random_batch(f.batch, f.seq, mc.vocab, static_cast<uint64_t>(s));
    if (layout) b = layout->shard_batch(b);
    const auto t0 = Clock::now();
    r.loss = step.run(params, opt, {b}, 3e-4, std::nullopt).loss;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (s == 0) continue;
    times.push_back(ms);
    double seconds = 0;
    for (const auto& p : step.spmd_programs()) seconds += p->last_comm_stats().at(0).seconds;
    comm.push_back(seconds * 1e3);
  }
  std::sort(times.begin(), times.end());
  std::sort(comm.begin(), comm.end());
  r.step_ms = times[times.size() / 2];
  r.comm_ms = comm[comm.size() / 2];
  for (const auto& p : step.spmd_programs()) {
    r.inserted_bytes += p->program().summary.per_device.total_bytes();
    r.calls += p->program().summary.per_device.total_calls();
    r.measured_bytes += p->last_comm_stats().at(0).total_bytes();
  }
  r.peak_bytes = static_cast<double>(step.peak_bytes());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Flags f = parse_flags(argc, argv);
    std::vector<Result> results;
    for (const std::string& layout : f.layouts) results.push_back(run_layout(f, layout));
    const double mib = 1024.0 * 1024.0;
    fmt::print("bench_spmd: GPT '{}' step, batch {} x seq {}, median of {} steps, virtual CPU devices in one process\n",
               f.preset, f.batch, f.seq, f.steps);
    fmt::print("{:<24} {:>9} {:>7} {:>12} {:>12} {:>8} {:>9} {:>12} {:>11}\n", "mesh", "step ms", "calls", "bytes/dev",
               "analytic", "ratio", "comm ms", "state MiB", "peak MiB");
    double worst = 0;
    std::string json_layouts;
    for (const Result& r : results) {
      double ratio = r.analytic_bytes > 0 ? r.inserted_bytes / r.analytic_bytes : (r.inserted_bytes > 0 ? 1e9 : 1.0);
      if (r.mesh != "single") worst = std::max(worst, ratio);
      fmt::print("{:<24} {:>9.1f} {:>7} {:>12.0f} {:>12.0f} {:>8.4f} {:>9.1f} {:>12.2f} {:>11.2f}\n", r.mesh, r.step_ms,
                 r.calls, r.inserted_bytes, r.analytic_bytes, ratio, r.comm_ms, r.state_bytes / mib,
                 r.peak_bytes / mib);
      json_layouts += fmt::format(
          "{}{{\"mesh\":\"{}\",\"step_ms\":{:.3f},\"loss\":{:.6f},\"collective_calls\":{},\"comm_bytes\":{:.0f},"
          "\"comm_bytes_measured\":{:.0f},\"analytic_bytes\":{:.0f},\"comm_ms\":{:.3f},\"state_bytes_per_device\":{:."
          "0f},"
          "\"peak_bytes_per_device\":{:.0f}}}",
          json_layouts.empty() ? "" : ",", r.mesh, r.step_ms, r.loss, r.calls, r.inserted_bytes, r.measured_bytes,
          r.analytic_bytes, r.comm_ms, r.state_bytes, r.peak_bytes);
    }
    fmt::print(
        "{{\"bench\":\"spmd\",\"preset\":\"{}\",\"rules\":\"{}\",\"batch\":{},\"seq\":{},\"steps\":{},"
        "\"layouts\":[{}],\"comm_bytes_vs_analytic_max\":{:.6f}}}\n",
        f.preset, f.rules, f.batch, f.seq, f.steps, json_layouts, worst);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_spmd: {}\n", e.what());
    return 1;
  }
}
