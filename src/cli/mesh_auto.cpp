#include "cli/mesh_auto.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/goodput/accelerators.h"
#include "tessera/plan/planner.h"
#include "tessera/spmd/runtime.h"

namespace tessera::cli {
namespace {

// Layouts predicted within this share of the fastest count as tied: the first of them in
// the search's order (data parallel first, then fsdp, then tensor) wins, so timing noise
// does not flip the choice between nearly equal layouts.
constexpr double kTie = 0.03;

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string choose_mesh_auto(const train::TrainConfig& config) {
  const int devices = spmd::device_count();
  const std::filesystem::path kept = std::filesystem::path(config.run.dir) / "mesh_auto";
  if (std::ifstream in(kept); in) {
    std::string line;
    std::getline(in, line);
    const std::string mesh = trim(line);
    if (!mesh.empty() && plan::PlanLayout::parse(mesh).chips() == devices) {
      if (spmd::is_primary_process())
        fmt::print("parallel: --mesh auto keeps {} (chosen when {} started: {})\n", mesh, config.run.dir,
                   kept.string());
      return mesh;
    }
  }
  if (devices == 1) return "data=1";
  if (config.run.device != "cpu")
    fail<ConfigError>("--mesh auto: sharded programs run on CPU devices only for now (run.device = {})",
                      config.run.device);

  const plan::HostRates* host = nullptr;
  goodput::AcceleratorSpec accelerator;
  std::string costed_on;
  if (spmd::is_multi_process()) {
    for (const goodput::AcceleratorSpec& a : goodput::builtin_accelerator_catalog())
      if (a.kind == "cpu") {
        accelerator = a;
        break;
      }
    costed_on = fmt::format("costed on configs/accelerators.toml [{}], the same on every rank", accelerator.key);
  } else {
    DType dtype = DType::Float32;  // the config has checked the name
    dtype_from_name(config.model.compute_dtype, &dtype);
    host = &plan::calibrate_host_steps(dtype);
    accelerator = host->accelerator();
    costed_on = "costed on this machine, measured";
  }
  plan::Planner planner(config);
  const plan::PlanRow row = planner.best(accelerator, devices, 1e9, {}, host);
  if (!row.found) fail<ConfigError>("--mesh auto: {}", row.reason);
  if (row.ranked.empty())
    fail<ConfigError>("--mesh auto: no layout of {} devices fits in memory: {}", devices, plan::fit_advice(row.step));
  // The first layout (in the search's order) within kTie of the fastest.
  const double fastest = row.ranked.front().second;
  std::string mesh = row.ranked.front().first;
  for (const plan::PlanLayout& l : planner.candidate_layouts(devices, devices)) {
    const auto it =
        std::find_if(row.ranked.begin(), row.ranked.end(), [&](const auto& r) { return r.first == l.mesh(); });
    if (it != row.ranked.end() && it->second <= fastest * (1 + kTie)) {
      mesh = it->first;
      break;
    }
  }
  if (spmd::is_primary_process()) {
    std::string others;
    for (size_t i = 0; i < row.ranked.size() && i < 4; ++i)
      if (row.ranked[i].first != mesh)
        others +=
            fmt::format("{}{} {:.1f} ms", others.empty() ? "" : ", ", row.ranked[i].first, row.ranked[i].second * 1e3);
    const double chosen =
        std::find_if(row.ranked.begin(), row.ranked.end(), [&](const auto& r) { return r.first == mesh; })->second;
    fmt::print("parallel: --mesh auto chose {} for {} devices: predicted step {:.1f} ms ({}; others: {})\n", mesh,
               devices, chosen * 1e3, costed_on, others.empty() ? "none fits" : others);
    std::filesystem::create_directories(config.run.dir);
    fileio::write_file_atomic(kept, mesh + "\n");
  }
  return mesh;
}

void apply_mesh_auto(const std::string& layout, train::TrainConfig& config) {
  const plan::PlanLayout l = plan::PlanLayout::parse(layout);
  config.parallel.mesh = l.mesh();
  if (l.pipeline_micro_batches > 0) config.parallel.pipeline_micro_batches = l.pipeline_micro_batches;
}

}  // namespace tessera::cli
