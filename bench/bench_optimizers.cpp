// bench_optimizers: the cost of one optimizer update (optim/optimizer.h) for each
// optimizer, on the parameters of a model preset: the jitted apply() with parameters
// and state donated (updated in place), as the trainer runs it, without the model.
//
//   build/bin/bench_optimizers [--preset tiny] [--updates 30] [--rounds 5] [--threads 0]
//
// Each round runs every optimizer in turn (interleaved) for --updates updates after
// one untimed warm-up update; the table reports the median time per update over rounds,
// that time relative to AdamW's (the fused adamw_update kernel), and the optimizer
// state bytes per parameter. The last line is JSON: per optimizer ms_per_update,
// ratio_to_adamw and state_bytes_per_param.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/api/jit.h"
#include "tessera/base/error.h"
#include "tessera/base/statistics.h"
#include "tessera/base/thread_pool.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "train_bench_util.h"

namespace ts = tessera;

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string preset = "tiny";
  int64_t updates = 30, rounds = 5, threads = 0;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string value = ts::bench::flag_value("bench_optimizers", argc, argv, i);
    if (arg == "--preset") {
      f.preset = value;
      continue;
    }
    const int64_t n = ts::bench::flag_integer("bench_optimizers", arg, value);
    if (arg == "--updates")
      f.updates = std::max<int64_t>(1, n);
    else if (arg == "--rounds")
      f.rounds = std::max<int64_t>(1, n);
    else if (arg == "--threads")
      f.threads = std::max<int64_t>(0, n);
    else
      ts::fail<ts::ValueError>("bench_optimizers: unknown flag {} (expected --preset, --updates, --rounds, --threads)",
                               arg);
  }
  return f;
}

// One optimizer's compiled update and its live parameters and state.
struct Case {
  std::string name;
  ts::optim::Optimizer optimizer;
  ts::Jitted step;
  ts::Tree params, state;
  double state_bytes_per_param = 0;
  std::vector<double> round_ms;
};

ts::Tree copy_tree(const ts::Tree& t) {
  return t.map([](const ts::Array& a) {
    const ts::Array e = a.eval();
    return ts::Array::from_data(e.raw_data(), e.shape(), e.dtype());
  });
}

double tree_bytes(const ts::Tree& t) {
  double bytes = 0;
  for (const ts::Array& a : t.leaves()) bytes += static_cast<double>(a.nbytes());
  return bytes;
}

Case make_case(const std::string& name, const ts::models::Model& model, const ts::Tree& params) {
  ts::optim::OptimizerConfig config;
  // "muon-bf16": Muon with its Newton-Schulz matmuls in bfloat16 (optimizer.muon_ns_dtype).
  config.name = name == "muon-bf16" ? "muon" : name;
  if (name == "muon-bf16") config.muon_ns_dtype = "bfloat16";
  ts::optim::Optimizer optimizer(config, model.specs());
  auto fn = [optimizer](const ts::Tree& a) {
    ts::optim::Optimizer::Update u = optimizer.apply(a.at("params"), a.at("grads"), a.at("state"), a.at("lr").leaf());
    return ts::Tree{{"params", u.params}, {"state", u.state}};
  };
  ts::Tree state = optimizer.init(params);
  double param_count = 0;
  for (const ts::Array& a : params.leaves()) param_count += static_cast<double>(a.size());
  // Leaves in Tree::leaves() order of {"grads", "lr", "params", "state"}: donate params and state.
  const ts::Tree probe{
      {"grads", params}, {"lr", ts::Array::scalar(1e-3, ts::DType::Float32)}, {"params", params}, {"state", state}};
  ts::JitOptions options;
  const std::vector<std::string> paths = probe.paths();
  for (size_t i = 0; i < paths.size(); ++i)
    if (paths[i].starts_with("params.") || paths[i].starts_with("state."))
      options.donate_leaves.push_back(static_cast<int>(i));
  options.name = "update_" + config.name;
  // Every element counts: the "step" scalar (8 bytes) is part of the state a checkpoint holds.
  const double state_bytes = tree_bytes(state);
  return Case{name, optimizer, ts::jit(fn, options), copy_tree(params), copy_tree(state), state_bytes / param_count,
              {}};
}

void run_updates(Case& c, const ts::Tree& grads, const ts::Array& lr, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    ts::Tree out = c.step(ts::Tree{{"grads", grads}, {"lr", lr}, {"params", c.params}, {"state", c.state}});
    c.params = out.at("params");
    c.state = out.at("state");
  }
  // Results are computed when read: wait for the last update's parameters.
  for (const ts::Array& a : c.params.leaves()) a.eval();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags flags = parse_flags(argc, argv);
    if (flags.threads > 0) ts::set_num_threads(static_cast<int>(flags.threads));
    const ts::models::Model model(ts::models::preset(flags.preset));
    const ts::Tree params = model.init(7);
    // Gradients of a plausible scale, fixed for every update (the update's cost does not
    // depend on the values).
    const std::vector<ts::Array> param_leaves = params.leaves();
    const std::vector<ts::Array> keys = ts::random::split_keys(ts::key(11), static_cast<int64_t>(param_leaves.size()));
    size_t leaf = 0;
    const ts::Tree grads =
        params.map([&](const ts::Array& p) { return ts::random::normal(keys[leaf++], p.shape(), p.dtype(), 0, 1e-3); });
    const ts::Array lr = ts::Array::scalar(1e-3, ts::DType::Float32);
    std::vector<Case> cases;
    for (const char* name : {"adamw", "sgd", "lion", "adafactor", "muon", "muon-bf16"})
      cases.push_back(make_case(name, model, params));
    for (Case& c : cases) run_updates(c, grads, lr, 1);  // compile and warm up
    for (int64_t r = 0; r < flags.rounds; ++r)
      for (Case& c : cases) {
        const auto start = Clock::now();
        run_updates(c, grads, lr, flags.updates);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        c.round_ms.push_back(ms / static_cast<double>(flags.updates));
      }

    const double adamw_ms = ts::median(cases[0].round_ms);
    fmt::print("optimizer update on preset {} ({} parameters, {} threads): median of {} rounds x {} updates\n",
               flags.preset, model.parameter_count(), ts::num_threads(), flags.rounds, flags.updates);
    fmt::print("| optimizer | ms/update | x AdamW | state bytes/param |\n|---|---|---|---|\n");
    nlohmann::json rows = nlohmann::json::array();
    for (const Case& c : cases) {
      const double ms = ts::median(c.round_ms);
      fmt::print("| {} | {:.3f} | {:.2f} | {:.2f} |\n", c.name, ms, ms / adamw_ms, c.state_bytes_per_param);
      rows.push_back({{"optimizer", c.name},
                      {"ms_per_update", ms},
                      {"ratio_to_adamw", ms / adamw_ms},
                      {"state_bytes_per_param", c.state_bytes_per_param}});
    }
    if (const char* profile = std::getenv("TESSERA_PROFILE"); profile != nullptr && std::string(profile) != "0")
      for (const Case& c : cases)
        fmt::print("kernel profile of {} (TESSERA_PROFILE=1):\n{}", c.name, c.step.profile_text());
    nlohmann::json out = {{"bench", "optimizers"},
                          {"preset", flags.preset},
                          {"parameters", model.parameter_count()},
                          {"threads", ts::num_threads()},
                          {"results", rows}};
    fmt::print("{}\n", out.dump());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_optimizers: {}\n", e.what());
    return 1;
  }
}
