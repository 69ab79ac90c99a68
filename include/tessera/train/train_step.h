// The compiled training step: forward, backward, (accumulation over micro-batches),
// global-norm clipping and the optimizer update, as jitted programs whose parameters
// and optimizer state are updated in place (donated buffers).
//
// One micro-batch per step: a single program  (params, opt, tokens, targets, lr[, key])
//   -> (params', opt', loss, grad_norm).
// k > 1 micro-batches: a gradient program run k times (the first returns the
// gradients, the others add theirs to the running sum in place) and an update program
// that applies the mean. Both orders of summation are fixed, so results are bitwise
// reproducible.
//
// With loss scaling (Optimizer::scales_loss) the backward pass is seeded with the
// optimizer state's scale instead of 1 (the gradients of loss * scale; the reported
// loss stays unscaled), the programs also take/return the scale, and the optimizer
// unscales, skips non-finite steps and updates the scale inside the same program.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/api/jit.h"
#include "tessera/data/loader.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/spmd/spmd_executable.h"
#include "tessera/train/parallel.h"

namespace tessera::train {

struct StepStats {
  double loss = 0;       // mean over the step's micro-batches (unscaled)
  double grad_norm = 0;  // before clipping (of the unscaled gradients)
  // Loss scaling (optimizer.loss_scale): whether the update was skipped for non-finite
  // gradients, and the scale after this step (halved on a skipped step); 0 without.
  bool skipped = false;
  double loss_scale = 0;
};

// One of the step's programs traced for the planner (TrainStep::trace_programs): the
// global program as jit would partition and compile it, not compiled.
struct TracedProgram {
  std::string name;  // "train_step", or "grad_first", "grad_accumulate", "update"
  compiler::Graph graph;
  std::vector<std::string> parameter_names;
  // The layout's shardings of the arguments and results; empty on one device.
  std::vector<std::optional<spmd::Sharding>> parameter_shardings, output_shardings;
  std::vector<bool> donated;
  double runs_per_step = 1;  // grad_accumulate runs micro_batches - 1 times
};

// Leaf indices (Tree::leaves() order) of the subtrees named in `prefixes`: the arguments
// a step program may overwrite with its outputs (JitOptions::donate_leaves).
std::vector<int> leaves_under(const Tree& args, const std::vector<std::string>& prefixes);

class TrainStep {
 public:
  // The programs run over the layout's mesh (train/parallel.h; nullptr: one device,
  // Layout::one_device): arguments must be placed with it (Layout::shard_params /
  // shard_opt_state / shard_batch); outputs keep the same layouts (gradients of the
  // accumulation path included).
  // `device`: where the programs run ("cpu", "cuda", "cuda:N"). On a GPU the parameters
  // and optimizer state stay in device memory between steps (donated buffers); reading
  // the loss is the step's only synchronization.
  TrainStep(const models::Model& model, const optim::Optimizer& optimizer, int64_t micro_batches,
            const Layout* layout = nullptr, std::string device = "cpu");

  // Updates params and opt_state in place. `micro` holds micro_batches batches;
  // `dropout_key` is required iff the model has dropout. Batches with segment ids and
  // positions (packed documents, data::Batch) become program arguments: the loss is
  // Model::loss with that packing. Whether batches are packed is fixed by the first
  // compile or run; a batch of the other kind is a ValueError (one program each).
  StepStats run(Tree& params, Tree& opt_state, const std::vector<data::Batch>& micro, double lr,
                const std::optional<Array>& dropout_key);

  // Traces and compiles the step's programs for these argument types without running
  // them (so compile time can be told apart from the first step's). run() compiles on
  // first use when this was not called.
  void compile(const Tree& params, const Tree& opt_state, const data::Batch& micro_batch,
               const std::optional<Array>& dropout_key);

  // The step's programs traced for these argument types (placeholders will do: nothing
  // is allocated or run), without compiling them: what tessera plan costs.
  std::vector<TracedProgram> trace_programs(const Tree& params, const Tree& opt_state, const data::Batch& micro_batch,
                                            const std::optional<Array>& dropout_key) const;

  // How many times the programs were traced (1 per program once warm).
  int trace_count() const;
  // Per-kernel times of the step's programs (when TESSERA_PROFILE=1 was set).
  std::string profile_text() const;

  // Model FLOPs of one program execution as the compiled program counts them.
  double compiled_flops() const { return compiled_flops_; }
  // FLOPs per primitive name over the compiled programs (each counted once).
  std::map<std::string, double> flops_by_op() const;
  // The SPMD programs (collectives per step, communication of the last run, per-device
  // memory); empty on one device.
  const std::vector<std::shared_ptr<spmd::SpmdExecutable>>& spmd_programs() const { return spmd_; }
  // The largest peak memory of the step's programs (one device's on a mesh).
  size_t peak_bytes() const;
  // Host offload (model.remat = "offload"), summed over the step's programs: the bytes
  // of activations kept in host memory instead of on the device, and the host arenas.
  size_t offloaded_bytes() const;
  size_t host_bytes() const;

 private:
  const models::Model& model_;
  const optim::Optimizer& optimizer_;
  int64_t micro_batches_;
  Layout layout_;
  std::string device_;
  std::optional<Jitted> fused_;       // micro_batches == 1
  std::optional<Jitted> grad_first_;  // micro_batches > 1
  std::optional<Jitted> grad_add_;
  std::optional<Jitted> update_;
  double compiled_flops_ = 0;
  std::optional<bool> packed_;  // whether the programs take segments and positions
  Tree grad_sum_;
  std::vector<std::shared_ptr<compiler::Executable>> executables_;
  std::vector<std::shared_ptr<spmd::SpmdExecutable>> spmd_;

  // The programs, created (traced and compiled) on first use.
  Jitted& fused_program(const Tree& args);
  Jitted& grad_program(bool first, const Tree& args);
  Jitted& update_program(const Tree& args);
  StepStats stats_of(const Tree& out, double loss) const;
  // Refuses a batch whose packing differs from the first one's.
  void check_packing(const data::Batch& batch);
};

// Validation: the mean loss of `params` over the first `batches` batches of `loader`
// (reset to its start first), with a jitted forward-only program traced once and
// reused by every later pass.
class Evaluator {
 public:
  // Validation batches are split over the layout's batch axes (nullptr: one device).
  explicit Evaluator(const models::Model& model, const Layout* layout = nullptr, const std::string& device = "cpu");
  double operator()(const Tree& params, data::DataLoader& loader, int64_t batches);

 private:
  Jitted forward_, packed_forward_;  // batches without / with segment ids
  Layout layout_;
};

// One-off form of Evaluator.
double evaluate(const models::Model& model, const Tree& params, data::DataLoader& loader, int64_t batches);

}  // namespace tessera::train
