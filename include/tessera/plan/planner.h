// tessera plan's search: for each accelerator and chip count, the layout (data x fsdp x
// tensor) that trains fastest among those that fit in memory, with what the run costs.
//
// Candidates: every factorization chips = data * fsdp * expert * tensor where tensor
// divides the attention heads (and the KV heads, the MLP width and the padded
// vocabulary: Megatron splits all four) and stays within the innermost interconnect
// domain (NVLink, one host), expert divides a mixture of experts' experts (1 for a dense
// model), and data * fsdp * expert divides the micro-batch. Each layout's per-device
// programs are traced, partitioned and optimized once (prepare_step) and costed on every
// accelerator (cost_step).
//
// Pipeline layouts (pipeline_layouts): pipeline=P outermost for P = 2, 4, 8 (dividing the
// chips, at most the model's layers), each stage on chips / P chips laid out with the
// widest tensor axis they allow and the rest as FSDP or as data replicas (expert axes as
// above). The stages, micro-batch count and schedule are the ones `tessera train --mesh
// <that layout>` forms from the config (train/pipeline_config.h: stages balanced by
// FLOPs), with each micro-batch count of pipeline_micro_batch_counts: more micro-batches
// shrink the bubble ((p-1)/(m+p-1) for 1F1B) but run smaller GEMMs more often, and under
// GPipe keep more activations; plan/step_model.h costs each (prepare_pipeline_step) and
// the layout's name says the count ("pipeline=2,data=2 m=8"). They come after the others
// in the search's order, so a tie goes to a layout without a bubble. A pipeline wins where the others' collectives
// cross a slow link (FSDP's all-gathers and data parallelism's all-reduces over DCN) and it hands only stage inputs
// over it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/plan/host_calibration.h"
#include "tessera/plan/run_model.h"
#include "tessera/plan/step_model.h"

namespace tessera::plan {

struct PlanRow {
  std::string accelerator;
  int64_t chips = 0;
  bool found = false;  // some layout is valid (it may still not fit)
  std::string reason;  // why none is, or what does not fit and the smallest change that does
  StepEstimate step;
  RunEstimate run;
  int layouts_tried = 0;
  // Every valid layout that fits, fastest first: mesh and predicted step seconds.
  std::vector<std::pair<std::string, double>> ranked;
};

class Planner {
 public:
  explicit Planner(train::TrainConfig config);
  const train::TrainConfig& config() const { return config_; }

  // Layouts of `chips` chips the model and batch allow (see the header comment).
  std::vector<PlanLayout> candidate_layouts(int64_t chips, int64_t max_tensor) const;
  // The pipeline layouts of `chips` chips the search tries (see the header comment),
  // one per micro-batch count of pipeline_micro_batch_counts.
  std::vector<PlanLayout> pipeline_layouts(int64_t chips, int64_t max_tensor) const;
  // The pipeline micro-batch counts the search tries for a pipeline layout: the one
  // `tessera train` takes from the config first, then stages x 1, 2 and 4 (stages: the
  // pipeline size times the virtual stages) where the batch splits so; only the config's
  // when it sets parallel.pipeline_micro_batches. Empty when the config's is refused.
  std::vector<int64_t> pipeline_micro_batch_counts(const PlanLayout& layout) const;

  // The best layout for `chips` of `accelerator` (or exactly `mesh`). `host` is the
  // calibration when `accelerator` is this machine.
  PlanRow best(const goodput::AcceleratorSpec& accelerator, int64_t chips, double tokens, const RunCosts& costs,
               const HostRates* host = nullptr, const std::optional<PlanLayout>& mesh = std::nullopt);

  // The step of one layout as `accelerator` compiles it, cached (prepare_step).
  const PreparedStep& prepared(const PlanLayout& layout, const goodput::AcceleratorSpec& accelerator);

 private:
  train::TrainConfig config_;
  std::map<std::string, PreparedStep> prepared_;
  std::map<std::string, std::string> invalid_;  // layout -> why prepare_step refused it
};

// The memory classes of an estimate that overflow and the smallest change that fits, as
// one sentence ("optimizer state 41.3 GB of 80 GB ...; fits with fsdp=16"). Empty when it fits.
std::string fit_advice(const StepEstimate& step);

}  // namespace tessera::plan
