// `tessera plan --model PRESET|--config FILE [--tokens N] [--accelerators h100,tpu_v5p,...]
// [--chips 8..4096] [--deadline DAYS] [--budget USD] [--mesh M] [--json] [--explain] [--html FILE]`:
// time, memory, cost and goodput of a training run per accelerator (plan/planner.h),
// then strong- and weak-scaling tables; --html also writes them as a page with charts
// (plan/report_html.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/goodput/accelerators.h"
#include "tessera/models/model.h"
#include "tessera/plan/planner.h"
#include "tessera/plan/report_html.h"
#include "tessera/train/config.h"

namespace tessera::cli {
namespace {

struct PlanOptions {
  std::string model;
  std::string config;
  std::vector<std::string> overrides;
  double tokens = 0;  // 0: 20 tokens per parameter (Chinchilla)
  std::string accelerators;
  std::string chips;
  std::string mesh;
  std::string html;  // also write the page here
  int64_t batch = 0;
  int64_t seq = 0;
  std::string catalog;  // an edited copy of configs/accelerators.toml (default: the built-in one)
  double deadline_days = 0;
  double budget = 0;
  double restart_s = plan::RunCosts{}.restart_seconds;
  double save_s = plan::RunCosts{}.save_seconds;
  bool json = false;
  bool explain = false;
  bool weak = true;
};

// "8..4096" (powers of two), "8,64,512" or "16".
std::vector<int64_t> parse_chips(const std::string& text) {
  auto number = [&](const std::string& s) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != s.size() || v < 1)
      fail<ConfigError>("--chips {}: '{}' is not a positive chip count (expected N, A..B or A,B,C)", text, s);
    return v;
  };
  std::vector<int64_t> out;
  if (const size_t dots = text.find(".."); dots != std::string::npos) {
    const int64_t lo = number(text.substr(0, dots)), hi = number(text.substr(dots + 2));
    if (hi < lo) fail<ConfigError>("--chips {}: the range is empty", text);
    for (int64_t c = lo; c <= hi; c *= 2) out.push_back(c);
    return out;
  }
  // A list: ascending, each once (weak scaling grows the batch from the smallest).
  auto sorted = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    out.push_back(number(text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return sorted(out);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string memory_cell(const plan::StepEstimate& s) {
  const std::string used = fmt::format("{:.1f}/{:.0f} GB", s.memory.peak / 1e9, s.memory_capacity / 1e9);
  return s.fits ? used : used + " NO";
}

nlohmann::json row_json(const plan::PlanRow& r) {
  nlohmann::json j{{"accelerator", r.accelerator}, {"chips", r.chips}, {"found", r.found}, {"reason", r.reason}};
  if (!r.found) return j;
  const plan::StepEstimate& s = r.step;
  j["mesh"] = s.layout.mesh();
  j["layout"] = s.layout.name();
  if (s.layout.pipeline > 1) j["pipeline_micro_batches"] = s.layout.pipeline_micro_batches;
  j["global_batch"] = s.global_batch;
  j["seq"] = s.seq;
  j["micro_batches"] = s.micro_batches;
  j["step_seconds"] = s.step_seconds;
  j["compute_seconds"] = s.compute_seconds;
  j["collective_seconds"] = s.collective_seconds;
  j["exposed_collective_seconds"] = s.exposed_collective_seconds;
  j["mfu"] = s.mfu;
  j["tokens_per_second"] = s.tokens_per_second;
  if (s.pipeline_bubble >= 0) j["pipeline_bubble"] = s.pipeline_bubble;
  j["memory"] = {
      {"peak", s.memory.peak},           {"parameters", s.memory.parameters},   {"optimizer", s.memory.optimizer},
      {"gradients", s.memory.gradients}, {"activations", s.memory.activations}, {"eval", s.memory.eval},
      {"host", s.memory.host},           {"capacity", s.memory_capacity},       {"fits", s.fits}};
  j["run"] = {{"tokens", r.run.tokens},
              {"steps", r.run.steps},
              {"raw_seconds", r.run.raw_seconds},
              {"goodput", r.run.goodput},
              {"seconds", r.run.seconds},
              {"mtbf_seconds", std::isfinite(r.run.mtbf_seconds) ? nlohmann::json(r.run.mtbf_seconds) : nullptr},
              {"checkpoint_interval_seconds", r.run.checkpoint_interval_seconds},
              {"chip_hours", r.run.chip_hours},
              {"dollars_raw", r.run.dollars_raw},
              {"dollars", r.run.dollars}};
  j["layouts_tried"] = r.layouts_tried;
  return j;
}

void print_row(const plan::PlanRow& r) {
  if (!r.found) {
    fmt::print("{:<13} {:>6}  {}\n", r.accelerator, r.chips, r.reason);
    return;
  }
  const plan::StepEstimate& s = r.step;
  fmt::print("{:<13} {:>6}  {:<31} {:>9} {:>6.1f}% {:>16} {:>9} {:>9} {:>9} {:>9} {:>6.1f}%\n", r.accelerator, r.chips,
             s.layout.name(), plan::format_duration(s.step_seconds), 100 * s.mfu, memory_cell(s),
             plan::format_duration(r.run.raw_seconds), plan::format_dollars(r.run.dollars_raw),
             plan::format_duration(r.run.seconds), plan::format_dollars(r.run.dollars), 100 * r.run.goodput);
  if (!r.reason.empty()) fmt::print("{:<13} {:>6}  {}\n", "", "", r.reason);
}

void print_header() {
  fmt::print("{:<13} {:>6}  {:<31} {:>9} {:>7} {:>16} {:>9} {:>9} {:>9} {:>9} {:>7}\n", "accelerator", "chips",
             "layout", "step", "MFU", "memory/chip", "time", "cost", "time*", "cost*", "goodput");
}

void print_explain(const plan::PlanRow& r) {
  const plan::StepEstimate& s = r.step;
  fmt::print("\n{} x{} {}: step {} = compute {} + exposed collectives {} (of {}){}; programs: ", r.accelerator, r.chips,
             s.layout.name(), plan::format_duration(s.step_seconds), plan::format_duration(s.compute_seconds),
             plan::format_duration(s.exposed_collective_seconds), plan::format_duration(s.collective_seconds),
             s.pipeline_bubble >= 0
                 ? fmt::format(" + pipeline idle {} (bubble {:.1f}% of the devices' schedule time; per device: the "
                               "ops table shows pipeline device 0's stages)",
                               plan::format_duration(s.step_seconds - s.compute_seconds - s.exposed_collective_seconds),
                               100 * s.pipeline_bubble)
                 : "");
  for (size_t i = 0; i < s.programs.size(); ++i) fmt::print("{}{}", i ? ", " : "", s.programs[i]);
  fmt::print("\n{:<28} {:<10} {:>8} {:>11} {:>11} {:>10} {:>6} {:>6}\n", "op", "kind", "kernels", "GFLOP", "MB", "ms",
             "util", "share");
  const double total = s.compute_seconds + s.collective_seconds;
  for (const plan::OpClassCost& op : s.ops) {
    fmt::print("{:<28} {:<10} {:>8} {:>11.2f} {:>11.2f} {:>10.3f} {:>6} {:>5.1f}%\n", op.op, op.kind, op.kernels,
               op.flops / 1e9, op.bytes / 1e6, op.seconds * 1e3,
               op.kind == "gemm" || op.kind == "attention" ? fmt::format("{:.2f}", op.utilization) : "",
               100 * op.seconds / total);
  }
  const plan::MemoryBreakdown& m = s.memory;
  fmt::print(
      "memory per chip: peak {:.3f} GB = parameters {:.3f} + optimizer {:.3f} + gradients {:.3f} + "
      "activations and temporaries {:.3f} + the validation program's arena {:.3f}; host offload {:.3f} GB; "
      "capacity {:.1f} GB\n",
      m.peak / 1e9, m.parameters / 1e9, m.optimizer / 1e9, m.gradients / 1e9, m.activations / 1e9, m.eval / 1e9,
      m.host / 1e9, s.memory_capacity / 1e9);
}

// Which row of an accelerator's chip counts to show: with a deadline the cheapest that
// meets it, with a budget the fastest within it, else the cheapest (goodput-adjusted).
const plan::PlanRow* choose(const std::vector<plan::PlanRow>& rows, double deadline_s, double budget,
                            std::string* why) {
  const plan::PlanRow* best = nullptr;
  for (const plan::PlanRow& r : rows) {
    if (!r.found || !r.step.fits) continue;
    if (deadline_s > 0 && r.run.seconds > deadline_s) continue;
    if (budget > 0 && r.run.dollars > budget) continue;
    const bool better =
        best == nullptr || (budget > 0 && deadline_s <= 0 ? r.run.seconds < best->run.seconds
                                                          : r.run.dollars < best->run.dollars * (1 - 1e-9) ||
                                                                (r.run.dollars <= best->run.dollars * (1 + 1e-9) &&
                                                                 r.run.seconds < best->run.seconds));
    if (better) best = &r;
  }
  *why = deadline_s > 0 ? "the cheapest that meets the deadline"
         : budget > 0   ? "the fastest within the budget"
                        : "the cheapest (goodput-adjusted)";
  return best;
}

int run_plan(const PlanOptions& o) {
  if (o.model.empty() == o.config.empty())
    fail<ConfigError>("tessera plan: give exactly one of --model PRESET ({}) and --config FILE",
                      fmt::format("{}", fmt::join(models::preset_names(), ", ")));
  std::vector<std::string> overrides = o.overrides;
  if (o.batch > 0) overrides.push_back(fmt::format("train.batch={}", o.batch));
  if (o.seq > 0) overrides.push_back(fmt::format("train.seq={}", o.seq));
  train::TrainConfig config =
      o.config.empty() ? train::parse_config(fmt::format("[model]\npreset = \"{}\"\n", o.model), "--model", overrides)
                       : train::load_config(o.config, overrides);
  const models::Model model(config.model);
  const double tokens = o.tokens > 0 ? o.tokens : 20.0 * static_cast<double>(model.parameter_count());

  const std::vector<goodput::AcceleratorSpec> catalog =
      o.catalog.empty() ? goodput::builtin_accelerator_catalog() : goodput::load_accelerator_catalog(o.catalog);
  std::vector<std::string> keys = split_list(o.accelerators);
  if (keys.empty())
    for (const goodput::AcceleratorSpec& a : catalog)
      if (a.kind != "cpu") keys.push_back(a.key);
  std::vector<int64_t> chip_counts = o.chips.empty() ? std::vector<int64_t>{} : parse_chips(o.chips);
  std::optional<plan::PlanLayout> mesh;
  if (!o.mesh.empty()) {
    mesh = plan::PlanLayout::parse(o.mesh);
    chip_counts = {mesh->chips()};
  }
  plan::RunCosts costs;
  costs.restart_seconds = o.restart_s;
  costs.save_seconds = o.save_s;

  plan::Planner planner(config);
  DType compute = DType::Float32;  // the config has checked the name
  dtype_from_name(config.model.compute_dtype, &compute);
  nlohmann::json out{{"model", o.model.empty() ? o.config : o.model},
                     {"parameters", model.parameter_count()},
                     {"batch", config.loop.batch},
                     {"seq", config.loop.seq},
                     {"compute_dtype", config.model.compute_dtype},
                     {"remat", config.model.remat},
                     {"tokens", tokens},
                     {"restart_seconds", costs.restart_seconds},
                     {"save_seconds", costs.save_seconds}};
  if (!o.json)
    fmt::print(
        "tessera plan: {} ({:.1f}M parameters), batch {} x {} tokens, {}, remat {}, {:.3g} tokens; restart "
        "{} s, checkpoint save {} s\n",
        o.model.empty() ? o.config : o.model, static_cast<double>(model.parameter_count()) / 1e6, config.loop.batch,
        config.loop.seq, config.model.compute_dtype, config.model.remat, tokens, costs.restart_seconds,
        costs.save_seconds);

  std::vector<std::pair<std::string, std::vector<plan::PlanRow>>> by_accelerator;
  for (const std::string& key : keys) {
    const plan::HostRates* host = nullptr;
    goodput::AcceleratorSpec acc;
    if (key == "host") {
      host = &plan::calibrate_host_steps(compute);
      acc = host->accelerator();
      if (!o.json) fmt::print("{}", host->text());
    } else {
      const std::optional<goodput::AcceleratorSpec> found = goodput::find_accelerator(catalog, key);
      if (!found) {
        std::vector<std::string> known;
        for (const goodput::AcceleratorSpec& a : catalog) known.push_back(a.key);
        fail<ConfigError>(
            "tessera plan: unknown accelerator '{}' (configs/accelerators.toml has {}; 'host' is this "
            "machine, measured)",
            key, fmt::join(known, ", "));
      }
      acc = *found;
    }
    std::vector<int64_t> counts = chip_counts;
    if (counts.empty()) counts = key == "host" ? std::vector<int64_t>{1, 2} : parse_chips("8..1024");
    std::vector<plan::PlanRow> rows;
    for (int64_t chips : counts) rows.push_back(planner.best(acc, chips, tokens, costs, host, mesh));
    by_accelerator.emplace_back(acc.key, std::move(rows));
  }

  const double deadline_s = o.deadline_days * 86400;
  nlohmann::json summary = nlohmann::json::array();
  if (!o.json) {
    fmt::print("\nper accelerator (time*/cost*: goodput-adjusted for failures, restarts and checkpoints):\n");
    print_header();
  }
  for (const auto& [key, rows] : by_accelerator) {
    std::string why;
    const plan::PlanRow* best = choose(rows, deadline_s, o.budget, &why);
    if (best == nullptr) {
      if (!o.json)
        fmt::print("{:<13} {:>6}  no chip count in the range fits{}{}\n", key, "-",
                   deadline_s > 0 ? " and meets the deadline" : "", o.budget > 0 ? " within the budget" : "");
      summary.push_back({{"accelerator", key},
                         {"found", false},
                         {"reason", fmt::format("no chip count in the range fits{}{}",
                                                deadline_s > 0 ? " and meets the deadline" : "",
                                                o.budget > 0 ? " within the budget" : "")}});
      continue;
    }
    if (!o.json) print_row(*best);
    nlohmann::json j = row_json(*best);
    j["chosen_as"] = why;
    summary.push_back(j);
  }
  out["plan"] = summary;

  nlohmann::json strong = nlohmann::json::array();
  if (!o.json) fmt::print("\nstrong scaling (global batch {} sequences):\n", config.loop.batch);
  if (!o.json) print_header();
  for (const auto& [key, rows] : by_accelerator)
    for (const plan::PlanRow& r : rows) {
      if (!o.json) print_row(r);
      strong.push_back(row_json(r));
    }
  out["strong_scaling"] = strong;

  // Weak scaling: the batch per chip of the smallest count held as chips grow.
  nlohmann::json weak = nlohmann::json::array();
  if (o.weak && !mesh) {
    bool printed = false;
    for (const auto& [key, rows] : by_accelerator) {
      if (rows.empty()) continue;
      const int64_t base = rows.front().chips;
      std::vector<plan::PlanRow> weak_rows;
      for (const plan::PlanRow& r : rows) {
        if ((config.loop.batch * r.chips) % base != 0 ||
            (config.loop.micro_batch > 0 && (config.loop.micro_batch * r.chips) % base != 0)) {
          plan::PlanRow skipped;
          skipped.accelerator = key;
          skipped.chips = r.chips;
          skipped.reason =
              fmt::format("{} sequences per {} chips do not scale to {} chips", config.loop.batch, base, r.chips);
          weak_rows.push_back(skipped);
          continue;
        }
        train::TrainConfig scaled = config;
        scaled.loop.batch = config.loop.batch * r.chips / base;
        scaled.loop.micro_batch = config.loop.micro_batch > 0 ? config.loop.micro_batch * r.chips / base : 0;
        plan::Planner weak_planner(scaled);
        const plan::HostRates* host = key == "host" ? &plan::calibrate_host_steps(compute) : nullptr;
        goodput::AcceleratorSpec acc = host != nullptr ? host->accelerator() : *goodput::find_accelerator(catalog, key);
        weak_rows.push_back(weak_planner.best(acc, r.chips, tokens, costs, host));
      }
      if (!o.json && !printed) {
        fmt::print("\nweak scaling ({} sequences per {} chips, the batch grows with the chips):\n", config.loop.batch,
                   rows.front().chips);
        print_header();
        printed = true;
      }
      for (const plan::PlanRow& r : weak_rows) {
        if (!o.json) print_row(r);
        nlohmann::json j = row_json(r);
        j["base"] = {{"batch", config.loop.batch}, {"chips", base}};  // sequences per this many chips
        weak.push_back(j);
      }
    }
  }
  out["weak_scaling"] = weak;

  if (o.explain) {
    for (const auto& [key, rows] : by_accelerator) {
      std::string why;
      const plan::PlanRow* r = choose(rows, deadline_s, o.budget, &why);
      if (r == nullptr)
        for (const plan::PlanRow& any : rows)
          if (any.found) r = &any;
      if (r != nullptr && !o.json) print_explain(*r);
    }
  }
  if (o.json) fmt::print("{}\n", out.dump());
  if (!o.html.empty()) {
    fileio::write_file_atomic(
        o.html, plan::render_plan_html(out, fmt::format("tessera plan: {}", out["model"].get<std::string>())),
        fileio::Durability::Atomic);
    // With --json, stdout stays the one JSON object.
    fmt::print(o.json ? stderr : stdout, "plan report: {}\n", o.html);
  }
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Step time, memory, cost and goodput of a training run per accelerator and layout (ISO-goodput)");
  sub->add_option("--model", options->model, "Model preset (tiny, small, gpt2-124m, llama-1b, ...)");
  sub->add_option("--config,-c", options->config, "Training config (TOML): model, batch, precision, remat");
  sub->add_option("--set", options->overrides, "Override a config key, as for tessera train (repeatable)");
  sub->add_option("--tokens", options->tokens, "Tokens to train on (default: 20 per parameter)");
  sub->add_option("--accelerators", options->accelerators,
                  "Comma-separated catalog keys of configs/accelerators.toml, or 'host' for this machine "
                  "(measured); default: every GPU and TPU");
  sub->add_option("--catalog", options->catalog,
                  "An accelerator catalog to use instead of the built-in configs/accelerators.toml (an edited copy: "
                  "prices, another network)");
  sub->add_option("--chips", options->chips, "Chip counts: N, A..B (powers of two) or A,B,C (default 8..1024)");
  sub->add_option("--mesh", options->mesh, "Cost exactly this layout, e.g. data=2,fsdp=4,tensor=8");
  sub->add_option("--batch", options->batch, "Global batch in sequences (= --set train.batch=N)");
  sub->add_option("--seq", options->seq, "Sequence length (= --set train.seq=N)");
  sub->add_option("--deadline", options->deadline_days, "Days the run must finish in (goodput-adjusted)");
  sub->add_option("--budget", options->budget, "Dollars the run may cost (goodput-adjusted)");
  sub->add_option("--restart-s", options->restart_s, "Seconds from a failure to training again");
  sub->add_option("--save-s", options->save_s, "Seconds a checkpoint save blocks training");
  sub->add_flag("--json", options->json, "Print one JSON object instead of the tables");
  sub->add_flag("--explain", options->explain, "Per-op breakdown of each accelerator's chosen configuration");
  sub->add_option("--html", options->html,
                  "Also write the plan as an HTML page with scaling charts (self-contained: inline SVG, no scripts)");
  return Command{sub, [options] { return run_plan(*options); }};
}

}  // namespace tessera::cli
