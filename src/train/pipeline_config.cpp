#include "train/pipeline_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <string>
#include <string_view>

#include "tessera/base/error.h"
#include "tessera/spmd/mesh.h"
#include "tessera/train/parallel.h"

namespace tessera::train {

namespace {

int parse_layer(std::string_view text, std::string_view entry) {
  int value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0)
    fail<ConfigError>("config: 'parallel.pipeline_stages': '{}' is not a layer range such as 0-3 or 4", entry);
  return value;
}

// "0-3,4-7" (inclusive, as the summary prints them) -> {[0, 4), [4, 8)}.
std::vector<std::pair<int, int>> parse_stage_layers(const std::string& text) {
  std::vector<std::pair<int, int>> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    std::string entry = text.substr(begin, comma - begin);
    std::erase(entry, ' ');
    const size_t dash = entry.find('-');
    const int first = parse_layer(std::string_view(entry).substr(0, dash), entry);
    const int last = dash == std::string::npos ? first : parse_layer(std::string_view(entry).substr(dash + 1), entry);
    if (last < first) fail<ConfigError>("config: 'parallel.pipeline_stages': '{}' ends before it starts", entry);
    out.emplace_back(first, last + 1);
    begin = comma + 1;
  }
  return out;
}

// The most micro-batches up to `most` that split `rows` (multiples of `step` only).
int64_t auto_micro_batches(int64_t rows, int64_t most, int64_t step) {
  for (int64_t m = std::min(rows, most); m >= 1; --m)
    if (rows % m == 0 && m % step == 0) return m;
  return 0;
}

}  // namespace

std::optional<PipelinePlan> pipeline_plan(const TrainConfig& c) {
  if (c.parallel.mesh.empty()) return std::nullopt;
  const spmd::Mesh mesh = spmd::Mesh::parse(c.parallel.mesh);
  if (!mesh.has_axis("pipeline")) return std::nullopt;
  PipelinePlan plan;
  plan.mesh = mesh;
  // An axis besides pipeline and data with more than one device partitions the stages
  // over the mesh (PipelineOptions::mesh); data alone gives replicas of the pipeline.
  bool inside = false;
  for (int a = 0; a < mesh.ndim(); ++a) {
    const std::string& name = mesh.axis_name(a);
    if (name != "pipeline" && name != "data" && mesh.axis_size(a) > 1) inside = true;
  }
  const int p = mesh.axis_size("pipeline");
  if (p < 2)
    fail<ConfigError>("config: 'parallel.mesh' = \"{}\": the pipeline axis needs at least 2 devices", c.parallel.mesh);
  PipelineOptions& o = plan.options;
  // Rows each pipeline micro-batch must split into: over the batch axes when the stages
  // are partitioned, else one per replica.
  int64_t split = 1;
  o.recompute = c.parallel.pipeline_recompute;
  if (inside) {
    o.mesh = mesh;
    o.rules = parse_axis_rules(c.parallel.rules);
    for (const std::string& axis : o.rules.count("batch") ? o.rules.at("batch") : std::vector<std::string>{})
      if (mesh.has_axis(axis)) split *= mesh.axis_size(axis);
  } else {
    plan.replicas = mesh.has_axis("data") ? mesh.axis_size("data") : 1;
  }
  o.devices = p;
  try {
    o.kind = parse_pipeline_kind(c.parallel.pipeline_schedule);
  } catch (const Error& e) {
    fail<ConfigError>("config: 'parallel.pipeline_schedule': {}", e.what());
  }
  const bool interleaved = o.kind == PipelineKind::kInterleaved;
  if (c.parallel.virtual_stages < 0 || (!interleaved && c.parallel.virtual_stages > 1))
    fail<ConfigError>(
        "config: 'parallel.virtual_stages' = {}: virtual stages are for parallel.pipeline_schedule = \"interleaved\" "
        "(here \"{}\"; 0 or 1)",
        c.parallel.virtual_stages, c.parallel.pipeline_schedule);
  o.virtual_stages = static_cast<int>(c.parallel.virtual_stages > 0 ? c.parallel.virtual_stages : interleaved ? 2 : 1);
  const int64_t rows = c.micro_batch_size();
  if (rows % plan.replicas != 0)
    fail<ConfigError>("config: the micro-batch of {} sequences does not split over data={} pipeline replicas", rows,
                      plan.replicas);
  if (rows % (plan.replicas * split) != 0)
    fail<ConfigError>(
        "config: the micro-batch of {} sequences does not split over the {} devices of the batch axes "
        "(parallel.mesh = \"{}\")",
        rows, split, c.parallel.mesh);
  const int64_t per_replica = rows / plan.replicas;
  const int64_t step = interleaved ? p : 1;
  if (c.parallel.pipeline_micro_batches == 0) {
    o.micro_batches =
        static_cast<int>(auto_micro_batches(per_replica / split, 2 * int64_t{p} * o.virtual_stages, step));
    if (o.micro_batches == 0)
      fail<ConfigError>(
          "config: a replica's {} sequences per micro-batch do not split into a multiple of {} pipeline micro-batches "
          "(interleaved needs one){}; raise train.micro_batch or train.batch",
          per_replica, p, split > 1 ? fmt::format(" of a multiple of {} rows (the batch axes)", split) : "");
  } else {
    const int64_t m = c.parallel.pipeline_micro_batches;
    if (m < 1 || per_replica % m != 0)
      fail<ConfigError>(
          "config: 'parallel.pipeline_micro_batches' = {} must divide the {} sequences each pipeline replica gets per "
          "micro-batch (train.micro_batch or train.batch / data)",
          m, per_replica);
    if ((per_replica / m) % split != 0)
      fail<ConfigError>(
          "config: 'parallel.pipeline_micro_batches' = {} gives pipeline micro-batches of {} sequences, which do not "
          "split over the {} devices of the batch axes (parallel.mesh = \"{}\")",
          m, per_replica / m, split, c.parallel.mesh);
    o.micro_batches = static_cast<int>(m);
  }
  if (!c.parallel.pipeline_stages.empty()) o.stage_layers = parse_stage_layers(c.parallel.pipeline_stages);
  try {
    make_pipeline_schedule(o.kind, o.devices, o.micro_batches, o.virtual_stages);
    const int stages = p * o.virtual_stages;
    if (c.model.layers < stages)
      fail<ValueError>("{} stages ({} devices x {} virtual stages) need at least {} layers; the model has {}", stages,
                       p, o.virtual_stages, stages, c.model.layers);
    if (!o.stage_layers.empty()) {
      if (static_cast<int>(o.stage_layers.size()) != stages)
        fail<ValueError>("'parallel.pipeline_stages' lists {} stages; the pipeline has {}", o.stage_layers.size(),
                         stages);
      int next = 0;
      for (const auto& [first, last] : o.stage_layers) {
        if (first != next)
          fail<ValueError>("'parallel.pipeline_stages': a stage starts at layer {} where layer {} was expected", first,
                           next);
        next = last;
      }
      if (next != c.model.layers)
        fail<ValueError>("'parallel.pipeline_stages' ends at layer {}; the model has {} layers (0-{})", next - 1,
                         c.model.layers, c.model.layers - 1);
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    fail<ConfigError>("config: {}", e.what());
  }
  return plan;
}

}  // namespace tessera::train
