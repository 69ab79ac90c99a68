// The planner's model of one training step (tessera plan): for a training config, a
// layout and an accelerator, what one optimizer step costs per device in time and
// memory.
//
// It reads the program the trainer would run, not a formula of the model: the step's
// programs are traced on placeholders (TrainStep::trace_programs), partitioned for the
// layout's mesh (spmd::partition, so the collectives are the ones jit would insert) and
// optimized by the compiler's own pipeline (fusion, remat, offload, the memory plan),
// and then every node of the per-device program is costed:
//
//   GEMMs (matmul, fused GEMM epilogues, int8 GEMMs) and attention:
//       flops / (peak(dtype) * efficiency(flops) * matrix_unit_use(m, n, k).utilization())
//       peak: bf16 / fp16 at peak_flops, int8 at peak_int8, float32 at half of peak_flops
//       (TF32 on tensor cores, multi-pass bf16 on an MXU) except on a calibrated CPU
//       host, which measures float32 itself; efficiency: gemm_efficiency, lowered for
//       small GEMMs by the calibrated curve eff * f / (f + f_half);
//   everything else: bytes / (memory_bandwidth * memory_efficiency);
//   every kernel: the larger of the two plus kernel_overhead;
//   collectives: an alpha-beta model per interconnect level (collective_seconds), the
//       group placed on the innermost level that holds it (mesh axes are laid out
//       row-major, the last axis innermost: tensor before fsdp before data).
//
// Overlap: on a GPU or TPU the collectives over batch axes (data, fsdp: parameter
// all-gathers, gradient reductions) run asynchronously beside compute, as XLA's and
// NCCL's do, and only the part longer than the program's compute is exposed; tensor-
// parallel collectives sit on the critical path. On a CPU host tessera's collectives
// are synchronous, so all of their time counts.
//
// Memory per device comes from the memory plans: the training state as the layout shards
// it, the arena of every step program (activations as the remat policy keeps them) and
// of the validation program, broken down by class (MemoryBreakdown).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/compiler/graph.h"
#include "tessera/compiler/pass.h"
#include "tessera/goodput/accelerators.h"
#include "tessera/train/config.h"
#include "tessera/train/pipeline_schedule.h"

namespace tessera::plan {

// A layout: mesh axes data x fsdp x expert x tensor (MaxText names; expert splits a
// mixture of experts' weights and dispatch, nn/moe.h) and the micro-batching.
struct PlanLayout {
  int64_t data = 1, fsdp = 1, tensor = 1, expert = 1;
  // Pipeline stages (train/pipeline.h, the outermost axis): costed by pipeline_model.h.
  int64_t pipeline = 1;
  // With a pipeline: its micro-batches per replica and accumulation step
  // (parallel.pipeline_micro_batches; 0: the config's, automatic by default).
  int64_t pipeline_micro_batches = 0;
  int64_t chips() const { return pipeline * data * fsdp * expert * tensor; }
  // "data=2,fsdp=4" (axes of size 1 left out; "data=1" for one chip).
  std::string mesh() const;
  // The mesh, and " m=8" when pipeline_micro_batches is set: "pipeline=2,data=2 m=8".
  std::string name() const;
  // Parses a mesh string of pipeline / data / fsdp / expert / tensor axes, optionally
  // followed by " m=N" as name() writes it (ConfigError otherwise).
  static PlanLayout parse(const std::string& mesh);
};

// How a calibrated CPU host runs kernels (host_calibration.h); for other accelerators
// the catalog's figures are used.
struct HostRates;

// What costing one kind of op came to over the step (per device).
struct OpClassCost {
  std::string op;          // primitive name ("matmul", "fused", "all_reduce", ...)
  std::string kind;        // gemm | attention | memory | collective
  int64_t kernels = 0;     // per step
  double flops = 0;        // per step
  double bytes = 0;        // per step (collectives: bytes each device sends)
  double seconds = 0;      // per step
  double utilization = 0;  // gemm/attention: FLOP-weighted matrix-unit utilization
};

// Per device. `activations` is the step programs' arenas (activations and temporaries:
// each program keeps its arena allocated, so with gradient accumulation they add up);
// `gradients` the accumulator between micro-batches (the fused step's gradients live in
// its arena).
struct MemoryBreakdown {
  double parameters = 0, optimizer = 0, gradients = 0, activations = 0;
  // The validation program's arena: the trainer compiles it beside the step and its
  // arena stays allocated.
  double eval = 0;
  double peak = 0;  // parameters + optimizer + gradients + activations + eval
  double host = 0;  // host offload arena
};

struct StepEstimate {
  std::string accelerator;  // catalog key
  PlanLayout layout;
  int64_t global_batch = 0, seq = 0, micro_batches = 1;
  std::string remat = "none";     // the model's checkpoint policy (model.remat)
  double compute_seconds = 0;     // kernels, per device
  double collective_seconds = 0;  // all collectives, per device
  double exposed_collective_seconds = 0;
  double step_seconds = 0;
  double model_flops = 0;  // per step, all chips (6N + attention, PaLM convention)
  double mfu = 0;          // model_flops / (step_seconds * chips * peak_flops)
  double tokens_per_second = 0;
  MemoryBreakdown memory;
  double memory_capacity = 0;  // the chip's
  bool fits = true;
  std::vector<OpClassCost> ops;       // by op, largest time first
  std::vector<std::string> programs;  // "train_step x1", ...
  // Pipeline layouts: the devices' idle share in the schedule replayed with the costed
  // stage programs (-1 without a pipeline axis).
  double pipeline_bubble = -1;
};

struct StepModelOptions {
  // Kernels the CPU host has measured (nullptr: use the catalog entry's figures).
  const HostRates* host = nullptr;
};

// The accelerator-independent half: the step's programs traced, partitioned for the
// layout and optimized, with their memory plan (the expensive part, shared by every
// accelerator a layout is costed on).
struct PreparedProgram {
  std::string name;
  double runs_per_step = 1;
  compiler::Graph graph;  // the optimized per-device program
};
// A pipeline layout's schedule and stage programs (pipeline_model.h).
struct PreparedPipeline {
  train::PipelineKind kind = train::PipelineKind::kOneFOneB;
  int devices = 1, micro_batches = 1, virtual_stages = 1;
  int64_t accumulation = 1;  // the step's accumulation micro-batches
  std::vector<std::pair<int, int>> stage_layers;
  std::vector<size_t> forward, backward;  // per stage: its programs in PreparedStep::programs
  std::vector<double> input_bytes;        // per stage: a device's part of its input
  size_t update = 0;                      // the optimizer update program
  int64_t devices_per_stage = 1;          // the mesh's other axes
  // The gradient sums of the pipeline device that holds the most (train/pipeline_step.h:
  // stage-local state): per parameter it holds, its bytes and the processes that hold it
  // (the chips at the pipeline coordinates whose stages read it), one all-reduce each.
  std::vector<std::pair<double, int64_t>> gradient_reductions;
};

struct PreparedStep {
  PlanLayout layout;
  std::optional<PreparedPipeline> pipeline;
  int64_t global_batch = 0, seq = 0, micro_batches = 1;
  std::string remat = "none";  // the model's checkpoint policy (model.remat)
  double model_flops = 0;
  MemoryBreakdown memory;
  // The same, each block (a tensor, an arena) counted at the capacity the host
  // allocator gives it (base/allocator.h: up to 12.5% more): what a CPU device holds.
  MemoryBreakdown host_memory;
  std::vector<PreparedProgram> programs;
};
// The options jit compiles with for `accelerator`'s kind: a GPU's programs read attention's
// q, k, v in place from the fused projection (CompileOptions::packed_attention).
compiler::CompileOptions compile_options_for(const goodput::AcceleratorSpec& accelerator);
PreparedStep prepare_step(const train::TrainConfig& config, const PlanLayout& layout,
                          const compiler::CompileOptions& compile = {});
StepEstimate cost_step(const PreparedStep& prepared, const goodput::AcceleratorSpec& accelerator,
                       const StepModelOptions& options = {});

// The step of `config` (model, batch, micro-batches, precision, remat, optimizer) on
// `layout` over `chips` of `accelerator`. ConfigError when the layout does not divide
// the batch or the model (naming what), or the accelerator entry is unusable.
StepEstimate estimate_step(const train::TrainConfig& config, const PlanLayout& layout,
                           const goodput::AcceleratorSpec& accelerator, const StepModelOptions& options = {});

// Seconds of one collective on `accelerator`'s interconnect: `kind` all_reduce |
// all_gather | reduce_scatter | all_to_all, `bytes` the full (gathered / unscattered)
// buffer per device, over `group` devices whose mesh stride is `stride` (devices
// between consecutive members). Hierarchical: the group is split into the part inside
// each level's domain; level i runs a ring over its part on bytes / (members below it).
double collective_seconds(const std::string& kind, double bytes, int64_t group, int64_t stride,
                          const goodput::AcceleratorSpec& accelerator);

}  // namespace tessera::plan
