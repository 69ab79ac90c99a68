// Pipeline-parallel gradients: a model's loss and parameter gradients computed by p
// pipeline devices (threads of this process, or one per process with
// PipelineOptions::ranks: mpirun or a TCP job) that run contiguous
// stages of its layers on micro-batches, in the order of a schedule
// (train/pipeline_schedule.h: GPipe, 1F1B, interleaved 1F1B).
//
// Each stage is two programs, compiled once: the forward of its layers
// (Model::stage_forward; the first stage embeds the tokens, the last ends with the
// loss summed over its micro-batch) and its backward (the vjp of that forward, which
// recomputes it: only the stage's input is kept per micro-batch in flight). Device d
// runs its ops in schedule order; a forward waits for its input activations, a
// backward for the gradient of its output, each handed over from the neighbouring
// stage's device. A stage's parameter gradients are added over micro-batches in
// micro-batch order (every schedule runs a stage's backwards in that order), so the
// result does not depend on timing; the loss is the sum over micro-batches divided by
// the targets that count, as Model::loss. A tied embedding ("wte" in the first and the
// last stage) gets the sum of both stages' gradients.
//
// PipelineExecutor keeps the programs between calls (a training step runs it every
// step); pipeline_value_and_grad is its one-off form. `tessera train --mesh
// pipeline=P[,data=R]` runs it through PipelineTrainStep (train/pipeline_step.h).
//
// FSDP, tensor and data parallelism inside the stages (PipelineOptions::mesh): each
// stage's programs are partitioned over the mesh's other axes and run on the devices
// at its pipeline coordinate; activations go shard by shard to the device with the
// same coordinates at the next stage.
//
// Evaluation (forward_loss) runs the schedule's forwards alone.
//
// Mixture of experts: the load-balancing loss averages the routing figures of every
// layer, so each stage hands on, beside the stream, those figures summed over the layers
// so far (Model::stage_forward), and the backward hands back their gradient. The term is
// each micro-batch's own, as gradient accumulation computes it (one device with as many
// accumulation steps gives the same step), weighted by the micro-batch's counted
// targets; evaluation computes the whole batch's (forward_loss, PipelineResult::routing),
// as one device's Evaluator does. Experts may be split over an `expert` axis inside the
// stages (PipelineOptions::mesh).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/api/jit.h"
#include "tessera/compiler/executable.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/partial_eval.h"
#include "tessera/core/array.h"
#include "tessera/core/tree.h"
#include "tessera/models/model.h"
#include "tessera/spmd/mesh.h"
#include "tessera/spmd/partitioner.h"
#include "tessera/train/parallel.h"
#include "tessera/train/pipeline_schedule.h"

namespace tessera::train {

struct PipelineOptions {
  PipelineKind kind = PipelineKind::kOneFOneB;
  int devices = 2;         // p: pipeline devices (threads)
  int micro_batches = 4;   // m: the batch splits into m equal micro-batches
  int virtual_stages = 1;  // v: stages per device (interleaved only)
  // Layers [first, last) of each of the p * v stages; empty: balanced by
  // pipeline_layer_costs.
  std::vector<std::pair<int, int>> stage_layers;
  // Processes instead of threads (mpirun): the world device of each pipeline device
  // (0 .. p-1). This process runs the one that is its own device; the others' hand-overs
  // are point-to-point messages (Communicator::send / recv). Empty: p threads here.
  std::vector<int> ranks;
  // FSDP / tensor / data parallelism inside the stages: the whole mesh (a `pipeline`
  // axis of `devices`, plus the layout's axes, train/parallel.h) and its axis rules.
  // When an axis besides `pipeline` has more than one device, each stage's two programs
  // are partitioned over those axes (parameters split by the rules, pipeline
  // micro-batch rows over the batch axes, the collectives inside the stage) and run on
  // the devices at the stage's pipeline coordinate: a thread per mesh device
  // (spmd::run_on_devices: the runtime needs mesh.size() devices), or with `ranks`
  // (then the devices of this process's pipeline group) this process's device. No axes:
  // one device per pipeline device.
  spmd::Mesh mesh;
  AxisRules rules = default_axis_rules();
  // true: a stage's backward recomputes its forward from the stage input (only the input
  // is kept per micro-batch in flight). false: the forward also returns the activations
  // its backward reads (compiler::partial_eval of the traced forward-and-backward at the
  // output gradient) and the backward starts from them: no second forward, more memory
  // per micro-batch in flight. Stages partitioned over the mesh split their partitioned
  // program; the backward all-gathers again the FSDP-split parameters it reads (a whole
  // copy of each is not kept per micro-batch in flight).
  bool recompute = true;
  // With `ranks` and partitioned stages: run() returns this process's device's gradient
  // shards (sharded arrays under param_sharding(), each complete for its piece) instead
  // of whole gradients, which the stage's devices would all-gather. The parameters may
  // then be given as such shards too (PipelineTrainStep's FSDP-sharded state).
  bool gradient_shards = false;
};

struct PipelineResult {
  double loss = 0;  // pipeline_value_and_grad: the mean over the counted targets; run(): see there
  Tree grads;       // the structure of the parameters
  std::vector<std::pair<int, int>> stage_layers;
  PipelineSchedule schedule;
  // The ops as they ran: each device thread's start and end times (seconds from the
  // step's start), the measured idle share and the micro-batches in flight.
  PipelineTimeline measured;
  // Bytes handed from one stage's device to another (activations forward, their
  // gradients backward), summed over the devices: what point-to-point sends would move.
  double sent_bytes = 0;
  // Stages partitioned over the mesh (PipelineOptions::mesh): bytes the collectives
  // inside the stages sent, summed over the devices (ring counts, spmd::CommStats).
  double stage_collective_bytes = 0;
  // forward_loss() of a model with a load-balancing loss: the last stage's routing
  // figures (Model::StageOutput::routing) summed over the micro-batches; empty otherwise
  // (and with processes, unless this process runs the last stage).
  std::vector<double> routing;
};

// The keys of a step's n parts (accumulation steps, replicas, pipeline micro-batches),
// as TrainStep gives its micro-batches theirs: the key itself for one part, else
// split_keys(key, n).
std::vector<Array> part_keys(const Array& key, int64_t n);

// The targets of a batch that count in the loss (those not -100).
double counted_targets(const Array& targets);

// into += add leaf by leaf, in place (how gradients add up over micro-batches and
// accumulation steps): `into` must own its buffers (nothing else may read them: a
// copy_tree of the first term).
void add_into_tree(Tree& into, const Tree& add);
// The tree's leaves copied into buffers of their own.
Tree copy_tree(const Tree& tree);

// Whether a stage of `layers` [first, last) reads the model parameter at `path`
// ("layers.<i>...", "wte", "wpe", "lnf", "head"): its layers; the embedding ("wte", and
// GPT-2's "wpe") when it is the first stage; the final norm and the head (or "wte" when
// tied) when it is the last. The one rule for what a stage holds (stage parameters,
// stage-local optimizer state, the collectives of partitioned stages).
bool stage_reads(const std::string& path, const std::pair<int, int>& layers, bool first, bool last, bool tied);
// Per leaf of `params` (in order): whether a stage of pipeline device d reads it (stage s
// runs on device s % devices).
std::vector<bool> device_reads(const Tree& params, const std::vector<std::pair<int, int>>& stage_layers, int devices,
                               int d, bool tied);

// Layer costs for balance_stages: each block's training FLOPs per token (6 x its
// parameters + 12 x seq x dim for attention; of a mixture of experts' expert weights the
// top_k / experts a token runs through), with the output head's (6 x dim x padded
// vocabulary) added to the last layer, since the last stage computes it.
std::vector<double> pipeline_layer_costs(const models::Model& model, int64_t seq);

// A pipeline over `model` whose stage programs are compiled once (on the first run or
// by compile()) and reused by every later run with the same batch shape.
class PipelineExecutor {
 public:
  // Checks the schedule and stage ranges (ValueErrors as pipeline_value_and_grad's).
  // Without options.stage_layers the stages are balanced by pipeline_layer_costs(model, seq).
  PipelineExecutor(const models::Model& model, const PipelineOptions& options, int64_t seq);

  // Traces and compiles every stage's two programs for `tokens_shape` batches without
  // running them.
  void compile(const Tree& params, const Shape& tokens_shape, bool packed = false);

  // One pass over the batch: result.loss = seed x the sum of the losses of its counted
  // targets (with a load-balancing loss, each micro-batch adds its term x its counted
  // targets), result.grads = the gradients of that (a caller splitting a batch passes
  // seed = 1 / the whole batch's counted targets and adds the parts up). With
  // options.ranks, only this process's stages contribute: the loss is 0 unless it runs
  // the last stage, the other stages' gradients are placeholders (no data), and the
  // measured timeline has this device's ops only; the caller adds them up over the
  // processes.
  // With packed documents (`packing`: segment ids and positions of the tokens' shape)
  // every stage reads its micro-batch's rows of them.
  // A model with dropout or int8 backward GEMMs (ModelConfig::needs_step_key) takes a
  // random `key` (ValueError without one, or with one it does not need): micro-batch i
  // uses part_keys(key, m)[i] (the key itself when m = 1, as the whole model's step
  // would), in its forward and the backward's recomputation alike.
  // With options.ranks the parameters other processes' stages read may be placeholders
  // (PipelineTrainStep keeps only its own stages' parameters).
  PipelineResult run(const Tree& params, const Array& tokens, const Array& targets, double seed,
                     const std::optional<models::Packing>& packing = std::nullopt,
                     const std::optional<Array>& key = std::nullopt);
  // The same with the micro-batches' keys given, one per micro-batch (ValueError for
  // another count): PipelineTrainStep passes those one device would draw accumulating
  // over every micro-batch of the step.
  PipelineResult run_with_keys(const Tree& params, const Array& tokens, const Array& targets, double seed,
                               const std::optional<models::Packing>& packing, const std::vector<Array>& keys);

  // Evaluation: the forward passes alone, in the schedule's order, with no dropout. The
  // loss of the batch's counted targets, summed (result.loss; with options.ranks 0 unless
  // this process runs the last stage), and the measured timeline; no gradients. With a
  // load-balancing loss, result.loss is the cross-entropy alone and result.routing the
  // micro-batches' routing figures: the caller adds Model::load_balancing_term of the
  // whole batch's (over every part it split the batch into) x its counted targets.
  PipelineResult forward_loss(const Tree& params, const Array& tokens, const Array& targets,
                              const std::optional<models::Packing>& packing = std::nullopt);

  const PipelineSchedule& schedule() const { return schedule_; }
  const std::vector<std::pair<int, int>>& stage_layers() const { return stage_layers_; }
  // How many stage programs have compiled (2 per stage this process runs, once warm).
  int compiled_programs() const;
  // Devices each stage runs on: the product of the mesh's axes besides pipeline (1
  // without PipelineOptions::mesh).
  int devices_per_stage() const { return inner_size_; }
  // Partitioned stages: the layout of the model's parameter at `path` on the mesh (the
  // stage programs' argument and gradient layout; replicated over the pipeline axis).
  // nullopt without partitioned stages.
  std::optional<spmd::Sharding> param_sharding(const std::string& path) const;
  // Partitioned stages across processes (with `ranks`): the whole array from this
  // process's device's `shard` of an array of `shape` and `dtype` laid out by `sharding`,
  // by an all-gather among the devices at its pipeline coordinate. A collective: each of
  // them calls it with its shard.
  Array whole_from_shard(const Array& shard, const Shape& shape, DType dtype, const spmd::Sharding& sharding) const;

  // The stages' programs after compile(): per stage its layers, then the forward's and
  // the backward's traced program, or for stages partitioned over the mesh the
  // per-device programs with their collectives and bytes (Lowered::text's form).
  std::string text() const;
  // Stages partitioned over the mesh: per stage and program, the collectives one run of
  // it makes on a device and the device's peak memory (one line each). Empty otherwise.
  std::string stage_summary() const;
  // Each stage's two programs traced for `tokens_shape` batches (partitioned over the
  // mesh's other axes when the stages are: then a device's program) without compiling
  // them: what the planner costs (plan/step_model.h).
  struct StageGraphs {
    compiler::Graph forward, backward;
    std::vector<std::string> forward_names, backward_names;  // their arguments' paths
    double input_bytes = 0;  // a device's part of the stage input (token ids or activations)
    // Without recompute: the activations the forward keeps for the backward, per
    // micro-batch in flight (beside the input): the backward's first `residuals`
    // parameters, their bytes.
    size_t residuals = 0;
    double residual_bytes = 0;
  };
  std::vector<StageGraphs> trace_stages(const Tree& params, const Shape& tokens_shape, bool packed = false) const;
  // Partitioned stages: the bytes their collectives should send in one run over a batch
  // of `batch` rows, summed over the devices (Layout::analytic_recomputed_part_bytes, or
  // with kept activations analytic_kept_part_bytes, per stage, micro-batch and device; a
  // GPT's parameter names; scalar reductions not counted). 0 otherwise.
  double analytic_collective_bytes(int64_t batch, int64_t seq) const;

 private:
  // A stage program partitioned over the mesh's axes besides pipeline, compiled for the
  // devices of this process at the stage's coordinate (by inner index).
  struct ShardedProgram {
    std::map<std::string, spmd::Sharding> in, out;  // by argument / output leaf path
    Tree out_structure;
    std::vector<std::unique_ptr<compiler::Executable>> per_device;
    std::string text;
    std::string collectives;      // the collective summary's first line: calls and bytes per kind
    double collective_bytes = 0;  // one run, one device (ring counts)
    size_t peak_bytes = 0;        // the most one of its devices holds while running it
  };

  // run() and forward_loss(): with forward_only the backward ops are skipped and the
  // forwards run without the step key (evaluation).
  PipelineResult execute(const Tree& params, const Array& tokens, const Array& targets, double seed,
                         const std::optional<models::Packing>& packing, const std::vector<Array>& keys,
                         bool forward_only);
  // The whole model's gradients from each stage's (run(); missing stages: placeholders).
  Tree assemble_grads(const Tree& params, std::vector<std::optional<Tree>> stage_grads) const;
  Tree stage_args(const Tree& params, int stage) const;
  // A stage program's arguments for tracing: its parameters, its input (`input`: x, and
  // for a mixture of experts past the first stage r), the targets on the last stage, and
  // the packing ("seg", "pos") of micro-batches of `micro` when packed.
  Tree trace_args(const Tree& params, int stage, const std::vector<Array>& input, const Shape& micro,
                  bool packed) const;
  // What a stage hands on (the next stage's input, or the last stage's loss), from its
  // forward's outputs: "y" (and with a load-balancing loss "r"), or "loss".
  static std::vector<Array> handed(const Tree& forward_out, bool last);
  // A hand-over's arrays as a program's arguments: the input "x" (and "r"), or with
  // `gradient` the gradients of a stage's outputs "dy" (and "dr").
  static void set_handed(Tree& args, const std::vector<Array>& arrays, bool gradient);
  // Placeholders of the arrays' types.
  static std::vector<Array> types_of(const std::vector<Array>& arrays);
  // The world device of pipeline device d (options.ranks), and this process's index.
  int local_index() const;
  bool sharded() const { return inner_size_ > 1; }
  // The layout of a stage program's argument or output leaf: p.* / dp.* parameters
  // (stage s's layers renumbered to the model's), x / dx / t activations and targets
  // over the batch axes, a scalar replicated.
  spmd::Sharding leaf_sharding(int stage, const std::string& path, const Array& leaf) const;
  ShardedProgram partition_program(int stage, const JitFn& fn, const Tree& args, const std::vector<int>& inner) const;
  // "collectives per run and device: all_gather N (bytes), ...": one run of a stage program.
  static std::string per_run_line(const spmd::CommStats& stats);
  // The traced program of fn partitioned over the mesh (argument and output layouts into
  // `layouts` when given).
  // `combine`: its small independent all-reduces combined (PartitionOptions).
  spmd::PartitionedProgram partition_stage(int stage, const JitFn& fn, const Tree& args, Tree* out_structure,
                                           ShardedProgram* layouts, bool combine = true) const;
  // Stage s's whole gradients (`whole`: its parameters, for the shapes) from its devices'
  // shards (accumulated, by stage x devices per stage + index). j_here < 0: every device
  // is in this process; else this process's device index, whose shards are swapped with
  // the stage's other devices, and only index 0 returns them (the others zeros, so a
  // sum over processes counts them once).
  // With PipelineOptions::gradient_shards (and j_here >= 0) the shards as sharded arrays.
  Tree assemble_stage_grads(int s, const Tree& whole, const std::vector<std::optional<Tree>>& accumulated,
                            int j_here) const;
  // The whole array from the shards of the stage's devices (by index among them).
  Array whole_from_inner(const std::vector<Array>& by_inner, const Shape& shape, DType dtype,
                         const spmd::Sharding& sharding) const;
  // A pipeline micro-batch's [rows, seq] for batches of tokens_shape (ShapeError unless it
  // splits into the micro-batches; ValueError unless partitioned stages split its rows).
  Shape micro_shape(const Shape& tokens_shape) const;
  // Mesh device -> (pipeline coordinate, index among the stage's devices).
  std::pair<int, int> coordinates(int device) const;
  const models::Model& model_;
  PipelineOptions options_;
  PipelineSchedule schedule_;
  std::vector<std::pair<int, int>> stage_layers_;
  std::vector<JitFn> forward_fn_, backward_fn_;
  std::vector<Jitted> forward_, backward_;
  // Evaluation's forwards of a model that takes a step key: the same functions traced
  // without it (no dropout), compiled on first use (`eval_compiled_`), or with partitioned
  // stages by compile() (`sharded_eval_`). A model without a key evaluates with forward_.
  std::vector<Jitted> eval_forward_;
  // Without recompute (PipelineOptions::recompute = false): per stage, its traced
  // forward-and-backward split at the output gradient and compiled (kept_program()).
  struct KeptProgram {
    // Per device of the stage (its index among them; one without a mesh): the two parts
    // compiled (with processes only this process's device).
    std::vector<std::unique_ptr<compiler::Executable>> forward, backward;
    std::vector<size_t> backward_parameters;  // the arguments (by leaf) the backward takes after the residuals
    Tree out_structure;          // the forward's first outputs (the rest are the residuals): "y" (and "r"), or "loss"
    Tree grads_structure;        // the backward's outputs: dp, and past the first stage dx (and dr)
    compiler::SplitGraph split;  // the two graphs (text(), the planner)
    // Partitioned stages: each part's collectives per run and device (stage_summary()).
    std::string forward_collectives, backward_collectives;
  };
  std::vector<KeptProgram> kept_;
  std::unique_ptr<std::atomic<bool>[]> kept_compiled_;
  std::vector<JitFn> keep_fn_;  // the stage's vjp that also returns its output ("y")
  bool keeps() const { return !options_.recompute; }
  // Traces (partitioned stages: and partitions) and splits stage s's forward-and-backward
  // for `args` (the backward's: with "dy"); compiles the two parts for the stage's devices
  // listed in `inner` (by index among them; {0} without a mesh; none: only traced).
  // Partitioned: the argument and output layouts into `layouts` when given.
  KeptProgram kept_program(int stage, const Tree& args, const std::vector<int>& inner,
                           ShardedProgram* layouts = nullptr) const;
  std::unique_ptr<std::atomic<bool>[]> eval_compiled_;
  std::vector<ShardedProgram> sharded_eval_;
  bool routed_ = false;  // the stages hand on routing figures (ModelConfig::balances_load)
  // Placeholders of each stage's hand-over types (compile()): y (and r), or its loss.
  std::vector<std::vector<Array>> stage_outputs_;
  std::unique_ptr<std::atomic<bool>[]> compiled_;  // per program: its first call (the compile) is done
  // Stages partitioned over the mesh (options.mesh has axes besides pipeline).
  std::optional<Layout> layout_;
  int inner_size_ = 1, pipeline_axis_ = -1;
  std::vector<int> inner_axes_;
  std::vector<ShardedProgram> sharded_forward_, sharded_backward_;  // per stage (compile())
  Shape compiled_tokens_;                                           // the batch shape they were compiled for
  bool compiled_packed_ = false;                                    // ... and with packed documents
  std::vector<std::string> traced_text_;                            // per program: text() without a mesh
};

// Loss and gradients of model.loss(params, tokens, targets) (no dropout, no packing)
// computed by the pipeline. ValueErrors: a batch that does not split into the
// micro-batches, stages that cannot be formed (more stages than layers, ranges that
// do not cover the layers in order), a bad schedule shape.
PipelineResult pipeline_value_and_grad(const models::Model& model, const Tree& params, const Array& tokens,
                                       const Array& targets, const PipelineOptions& options);

}  // namespace tessera::train
