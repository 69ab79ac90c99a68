#include "tessera/plan/planner.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/base/error.h"
#include "tessera/models/model.h"
#include "train/pipeline_config.h"

namespace tessera::plan {
namespace {

std::string gb(double bytes) { return fmt::format("{:.1f} GB", bytes / 1e9); }

}  // namespace

Planner::Planner(train::TrainConfig config) : config_(std::move(config)) {}

std::vector<PlanLayout> Planner::candidate_layouts(int64_t chips, int64_t max_tensor) const {
  const models::ModelConfig& m = config_.model;
  const int64_t kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  const models::Model model(m);
  const int64_t mlp = m.resolved_mlp_dim();
  const int64_t vocab = m.padded_vocab();
  const int64_t micro = config_.micro_batch_size();
  std::vector<PlanLayout> out;
  // A mixture of experts also splits its experts over an `expert` axis (a batch axis too:
  // the tokens are routed in groups per batch device, nn/moe.h).
  const int64_t experts = m.moe() ? m.moe_experts : 1;
  for (int64_t t = 1; t <= chips && t <= std::max<int64_t>(1, max_tensor); ++t) {
    if (chips % t != 0 || m.heads % t != 0 || kv % t != 0 || mlp % t != 0 || vocab % t != 0) continue;
    for (int64_t e = 1; e <= experts && e <= chips / t; ++e) {
      if (experts % e != 0 || (chips / t) % e != 0) continue;
      const int64_t rest = chips / t / e;
      for (int64_t f = 1; f <= rest; ++f) {
        if (rest % f != 0) continue;
        const int64_t d = rest / f;
        if (micro % (d * f * e) != 0) continue;
        out.push_back({.data = d, .fsdp = f, .tensor = t, .expert = e});
      }
    }
  }
  return out;
}

std::vector<int64_t> Planner::pipeline_micro_batch_counts(const PlanLayout& layout) const {
  // The count `tessera train` would take, then multiples of the stages (virtual ones
  // included: interleaving needs a multiple of the pipeline size). Counts the config
  // refuses (they do not divide a replica's rows, or its rows over the batch axes) are
  // left out; an explicit parallel.pipeline_micro_batches is the only count.
  train::TrainConfig c = config_;
  c.parallel.mesh = layout.mesh();
  // The pipeline `tessera train` would form with m micro-batches (0: automatic), or
  // nullopt where the config refuses that count.
  auto resolved = [&](int64_t m) -> std::optional<train::PipelineOptions> {
    c.parallel.pipeline_micro_batches = m;
    try {
      const std::optional<train::PipelinePlan> plan = train::pipeline_plan(c);
      if (plan) return plan->options;
    } catch (const Error&) {
    }
    return std::nullopt;
  };
  std::vector<int64_t> out;
  const std::optional<train::PipelineOptions> configured = resolved(config_.parallel.pipeline_micro_batches);
  if (!configured) return out;  // the config's own count is refused: prepare_step says why
  out.push_back(configured->micro_batches);
  if (config_.parallel.pipeline_micro_batches != 0) return out;
  const int64_t stages = layout.pipeline * configured->virtual_stages;
  for (int64_t m = stages; m <= 4 * stages; m *= 2) {
    if (std::find(out.begin(), out.end(), m) != out.end()) continue;
    if (const std::optional<train::PipelineOptions> o = resolved(m); o && o->micro_batches == m) out.push_back(m);
  }
  return out;
}

std::vector<PlanLayout> Planner::pipeline_layouts(int64_t chips, int64_t max_tensor) const {
  std::vector<PlanLayout> out;
  for (int64_t p = 2; p <= 8 && p <= chips && p <= config_.model.layers; p *= 2) {
    if (chips % p != 0) continue;
    // Each stage's chips: the widest tensor axis, then FSDP alone or data replicas alone.
    const std::vector<PlanLayout> inside = candidate_layouts(chips / p, max_tensor);
    int64_t widest = 1;
    for (const PlanLayout& l : inside) widest = std::max(widest, l.tensor);
    for (PlanLayout l : inside) {
      if (l.tensor != widest || (l.data > 1 && l.fsdp > 1)) continue;
      l.pipeline = p;
      const std::vector<int64_t> counts = pipeline_micro_batch_counts(l);
      if (counts.empty()) out.push_back(l);  // refused: its error is kept as the reason
      for (int64_t m : counts) {
        l.pipeline_micro_batches = m;
        out.push_back(l);
      }
    }
  }
  return out;
}

const PreparedStep& Planner::prepared(const PlanLayout& layout, const goodput::AcceleratorSpec& accelerator) {
  const compiler::CompileOptions compile = compile_options_for(accelerator);
  const std::string key = layout.name() + (compile.packed_attention ? " packed attention" : "");
  if (auto it = prepared_.find(key); it != prepared_.end()) return it->second;
  return prepared_.emplace(key, prepare_step(config_, layout, compile)).first->second;
}

PlanRow Planner::best(const goodput::AcceleratorSpec& accelerator, int64_t chips, double tokens, const RunCosts& costs,
                      const HostRates* host, const std::optional<PlanLayout>& mesh) {
  PlanRow row;
  row.accelerator = accelerator.key;
  row.chips = chips;
  const int64_t domain =
      accelerator.links.empty() || accelerator.links[0].devices == 0 ? chips : accelerator.links[0].devices;
  std::vector<PlanLayout> layouts;
  if (mesh) {
    if (mesh->chips() != chips)
      fail<ConfigError>("plan: mesh {} has {} devices, not {}", mesh->mesh(), mesh->chips(), chips);
    layouts.push_back(*mesh);
  } else {
    layouts = candidate_layouts(chips, domain);
    for (const PlanLayout& l : pipeline_layouts(chips, domain)) layouts.push_back(l);
  }
  if (layouts.empty()) {
    row.reason = fmt::format("no layout of {} chips splits the micro-batch of {} and the model's heads", chips,
                             config_.micro_batch_size());
    return row;
  }
  StepModelOptions options;
  options.host = host;
  std::optional<StepEstimate> best_fit, best_any;
  for (const PlanLayout& layout : layouts) {
    const std::string key = layout.name();
    if (invalid_.contains(key)) {
      if (mesh) fail<ConfigError>("{}", invalid_[key]);
      continue;
    }
    const PreparedStep* prep = nullptr;
    try {
      prep = &prepared(layout, accelerator);
    } catch (const ConfigError& e) {
      if (mesh) throw;  // the layout asked for: its error is the answer
      invalid_[key] = e.what();
      continue;
    } catch (const ShapeError& e) {
      if (mesh) throw;
      invalid_[key] = e.what();
      continue;
    } catch (const ValueError& e) {  // a pipeline whose micro-batches do not split, ...
      if (mesh) throw;
      invalid_[key] = e.what();
      continue;
    }
    ++row.layouts_tried;
    StepEstimate step = cost_step(*prep, accelerator, options);
    // Ranked by the layout as prepared: a pipeline's resolved micro-batch count included.
    if (step.fits) row.ranked.emplace_back(prep->layout.name(), step.step_seconds);
    if (step.fits && (!best_fit || step.step_seconds < best_fit->step_seconds)) best_fit = step;
    if (!best_any || step.memory.peak < best_any->memory.peak) best_any = step;
  }
  if (!best_any) {
    row.reason = layouts.size() == 1 && invalid_.contains(layouts[0].name())
                     ? invalid_[layouts[0].name()]
                     : fmt::format("none of {} layouts of {} chips is valid for this model", layouts.size(), chips);
    return row;
  }
  std::stable_sort(row.ranked.begin(), row.ranked.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  row.found = true;
  row.step = best_fit ? *best_fit : *best_any;
  if (!best_fit) row.reason = fit_advice(row.step);
  row.run = estimate_run(row.step, accelerator, tokens, costs);
  return row;
}

std::string fit_advice(const StepEstimate& step) {
  const MemoryBreakdown& m = step.memory;
  if (m.peak <= step.memory_capacity) return {};
  const double over = m.peak - step.memory_capacity;
  // The largest class is the one to shrink; say what shrinks it.
  struct Class {
    const char* name;
    double bytes;
    const char* remedy;
  };
  // Activations: the remat policies that keep less than the one in use.
  const char* activations = step.remat == "offload" ? "a smaller micro-batch (loop.micro_batch)"
                            : step.remat == "full"
                                ? "remat = \"offload\" (block inputs in host memory), or a smaller micro-batch "
                                  "(loop.micro_batch)"
                                : "remat = \"full\" or \"offload\", or a smaller micro-batch (loop.micro_batch)";
  std::vector<Class> classes = {
      {"parameters", m.parameters, "shard them further (fsdp or tensor) or use more chips"},
      {"optimizer state", m.optimizer, "shard it further (fsdp) or use more chips"},
      {"gradients", m.gradients, "shard them further (fsdp)"},
      {"activations", m.activations, activations},
      {"the validation program's arena", m.eval,
       "a smaller micro-batch (loop.micro_batch): validation runs one micro-batch at a time"},
  };
  std::sort(classes.begin(), classes.end(), [](const Class& a, const Class& b) { return a.bytes > b.bytes; });
  return fmt::format("does not fit: {} per chip against {} ({} over); the largest class is {} ({}): {}; next {} ({})",
                     gb(m.peak), gb(step.memory_capacity), gb(over), classes[0].name, gb(classes[0].bytes),
                     classes[0].remedy, classes[1].name, gb(classes[1].bytes));
}

}  // namespace tessera::plan
