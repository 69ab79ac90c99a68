// The training step on a mesh with a `pipeline` axis (`--mesh pipeline=P[,data=R]`):
// R data-parallel replicas of a P-device pipeline (train/pipeline.h), all threads of
// this process, then one optimizer update. With FSDP or tensor axes on the mesh
// (`--mesh pipeline=2,fsdp=2,tensor=2`) there is one pipeline whose stages are
// partitioned over the mesh's other axes, data included (PipelineOptions::mesh).
//
// Each of the step's k accumulation micro-batches (train.micro_batch) splits into R
// equal row blocks; replica r runs its block through its pipeline (which splits it
// again into m pipeline micro-batches and runs them in the schedule's order). The
// backward passes are seeded with 1 / (the micro-batch's counted targets), so the
// replicas' gradients add up to the gradient of the micro-batch's mean loss, as on one
// device. The update program sums the R x k gradient trees in a fixed order (replicas
// inside accumulation steps), divides by k, clips and applies the optimizer: the
// result does not depend on thread timing, and equals the one-device step to float
// rounding (tests/train/test_pipeline_step.cpp).
//
// In-process (device threads sharing one memory) the parameters and optimizer state stay
// whole: every stage reads its slice of them.
//
// Under mpirun or in a TCP job (one process per mesh device: `mpirun -n P*R tessera
// train --mesh pipeline=P,data=R`, or `tessera launch --nproc P*R --coordinator ...`)
// each process runs its device's stages of its replica's pipeline; activations and
// gradients cross processes as point-to-point messages. The parameters and optimizer
// state are stage-local: a process holds only what its stages read (stage_reads; a tied
// embedding on the first and the last stage's processes), the rest of its trees are
// placeholders with no data (place()), so a process holds about 1/P of the model's
// parameters, gradients and optimizer moments. After the stages ran:
//   - each gradient is summed over the processes that hold its parameter (the replicas
//     at its pipeline coordinate, and for a tied embedding the first and last stage's),
//     in rank order;
//   - the global gradient norm (clipping, loss scaling's finite check) is the root of
//     the sum over the processes of their squared norms, each parameter counted by the
//     lowest rank that holds it (Optimizer::apply's squared_norm);
//   - every process updates its own parameters and moments.
// Checkpoints stay whole (gathered(): a collective), so they restore onto any pipeline
// size; evaluation runs the stages' forwards (evaluate()).
//
// Packed documents (data.pipeline.packing = "documents"): every stage reads its
// micro-batch's segment ids and positions.
//
// Loss scaling (float16 compute, optimizer.loss_scale): the backward passes are seeded
// with the optimizer state's scale / the counted targets, and the update unscales the
// summed gradients and skips the step when one is not finite, as the one-device step.
//
// Dropout and int8 backward GEMMs (stochastic rounding) take the step's random key: each
// stage program reads its micro-batch's key, the one one device draws for that
// micro-batch when it accumulates over every pipeline micro-batch of the step
// (keys_of). So a step with m micro-batches per replica equals one device's with
// accumulation x R x m accumulation steps over the same rows and key, as with a mixture
// of experts' load-balancing term; with one micro-batch, one replica and no accumulation
// it is one device's plain step.
//
// With partitioned stages in-process, the parameters and optimizer state stay whole
// between steps (the device threads share one memory) and every stage device reads its
// shards of them. Across processes each
// process keeps only its device's shards of its stages' parameters and their moments
// (FSDP- and tensor-split ones; those split over no axis whole): the stage programs read
// them as they are, the gradients stay shards (each complete for its piece: the programs
// reduced them inside the stage), the tied embedding's are summed between its first and
// last stage's devices of the same piece, the norm counts each piece once, and each
// process updates its shards. Adafactor and Muon read whole matrices in their updates
// (Adafactor's row and column means, Muon's Newton-Schulz iterations): with them the
// update is itself an SPMD program over the mesh, partitioned like the stages, so its
// reductions and gathers run among the devices of a pipeline coordinate; state leaves
// shaped like their parameter are held as shards, the others (Adafactor's factored rows
// and columns, 0-d slots) whole, as Layout places them in-process.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/api/jit.h"
#include "tessera/data/loader.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/spmd/mesh.h"
#include "tessera/spmd/sharding.h"
#include "tessera/train/pipeline.h"
#include "tessera/train/train_step.h"

namespace tessera::train {

class PipelineTrainStep {
 public:
  // accumulation: the step's micro-batches (k); replicas: R; seq: tokens per sequence
  // (stage balancing). ValueErrors for the unsupported cases above. Under several
  // processes `mesh` (with a `pipeline` axis and optionally `data`) must cover the
  // world: it says which pipeline and replica this process's device belongs to.
  PipelineTrainStep(const models::Model& model, const optim::Optimizer& optimizer, int64_t accumulation,
                    const PipelineOptions& pipeline, int replicas, int64_t seq, const spmd::Mesh* mesh = nullptr);

  // Whether processes of a pipeline with these options keep their device's shards of the
  // state (the header comment): stages partitioned over the mesh. The planner costs the
  // same. (`optimizer` names the update: every optimizer shards now.)
  static bool shards_state(const PipelineOptions& pipeline, const std::string& optimizer);
  // Whether `optimizer`'s update reads whole matrices (adafactor, muon): with sharded
  // state it runs as an SPMD program over the mesh instead of on each process's shards.
  static bool updates_whole_matrices(const std::string& optimizer);

  // Compiles every replica's stage programs and the update program without running them.
  void compile(const Tree& params, const Tree& opt_state, const data::Batch& micro_batch);

  // Several processes: whether this process's stages read the parameter at `path`, what
  // it builds (Model::init's materialize) and keeps; in-process every path.
  bool holds(const std::string& path);
  // The optimizer state of parameters built that way (or placed): the held parameters'
  // moments, placeholders for the others, so a process never allocates the whole
  // model's state; in-process optimizer.init(params).
  Tree init_state(const Tree& params);

  // Several processes: replaces the leaves of params (and of the optimizer state's
  // parameter-shaped slots) that this process's stages do not read with placeholders,
  // freeing them. run() does it too; in-process it changes nothing.
  void place(Tree& params, Tree& opt_state);
  // `tree` (the parameters or the optimizer state, placed or whole) with every leaf's
  // data on every process, or with `to` >= 0 on world device `to` alone (a checkpoint's
  // writer; the others get their own tree back): each leaf a receiver lacks is broadcast
  // from the lowest rank that holds it. A collective (every process calls it); the
  // identity in-process.
  Tree gathered(const Tree& tree, int to = -1);
  // The bytes of data this process holds in the trees (placeholders hold none).
  static double held_bytes(const Tree& tree);
  // The leaves of a tree shaped like the parameters that `keep` selects, at their own
  // paths (lists become dicts keyed by index, so the paths and the optimizer's per-path
  // rules stay the same); and back into `whole`.
  static Tree select(const Tree& whole, const std::vector<bool>& keep);
  static Tree merge(const Tree& whole, const Tree& selected);

  // The mean of the batches' mean validation losses over the first `batches` batches of
  // `loader` (as Evaluator does on one device), through the stages' forward passes: each
  // replica its rows, no dropout. Several processes: a collective.
  double evaluate(const Tree& params, data::DataLoader& loader, int64_t batches);

  // Updates params and opt_state in place from `micro` (k batches). A model with dropout
  // or int8 backward GEMMs takes the step's random key (as TrainStep::run): accumulation
  // step i uses split_keys(key, k)[i] as one device does (the key itself when k = 1), and
  // replica r of R its split_keys(that, R)[r].
  StepStats run(Tree& params, Tree& opt_state, const std::vector<data::Batch>& micro, double lr,
                const std::optional<Array>& key = std::nullopt);

  const PipelineSchedule& schedule() const { return executors_.front().schedule(); }
  const std::vector<std::pair<int, int>>& stage_layers() const { return executors_.front().stage_layers(); }
  int replicas() const { return replicas_; }
  bool multi_process() const { return multi_process_; }
  // The last step's measured timelines: replica r's pipeline in its last accumulation step.
  const std::vector<PipelineTimeline>& last_timelines() const { return last_timelines_; }
  // The devices' idle share in the last step: 1 - busy / (devices x makespan), over every
  // replica's pipelines and accumulation steps.
  double last_bubble_fraction() const { return last_bubble_; }
  // Bytes the last step handed between stage devices (PipelineResult::sent_bytes), all
  // replicas and accumulation steps.
  double last_sent_bytes() const { return last_sent_bytes_; }
  // Bytes the collectives inside partitioned stages sent in the last step (ring counts,
  // summed over the devices; 0 without PipelineOptions::mesh).
  double last_collective_bytes() const { return last_collective_bytes_; }
  // What last_collective_bytes should be for a step over micro-batches of `rows`
  // sequences (PipelineExecutor::analytic_collective_bytes, every accumulation step).
  double analytic_collective_bytes(int64_t rows, int64_t seq) const {
    return static_cast<double>(accumulation_) * executors_.front().analytic_collective_bytes(rows, seq);
  }

  // The summary's parallel block: the mesh's use, the stages and their layers, the
  // schedule with its analytic and last measured bubble, the last step's timeline.
  std::string describe() const;

 private:
  const models::Model& model_;
  const optim::Optimizer& optimizer_;
  int64_t accumulation_;
  int replicas_ = 1;
  spmd::Mesh mesh_;  // PipelineOptions::mesh: the stages' partitioning (no axes: none)
  bool multi_process_ = false;
  spmd::Mesh world_mesh_;                    // several processes: the job's mesh (with the pipeline axis)
  int replica_here_ = 0;                     // several processes: this process's data coordinate
  std::vector<PipelineExecutor> executors_;  // one per replica: its own programs (no two threads share one)
  std::optional<Jitted> update_;
  std::vector<PipelineTimeline> last_timelines_;
  double last_bubble_ = 0, last_sent_bytes_ = 0, last_collective_bytes_ = 0;

  // Stage-local state (several processes), by leaf of the parameters (their order):
  struct Placement {
    std::vector<std::string> paths;
    std::vector<bool> held;                  // this process's stages read it
    std::vector<bool> counted;               // this process is the lowest rank holding it (the norm's term)
    std::vector<std::vector<int>> owners;    // the world devices that hold it, in rank order
    double held_bytes = 0, whole_bytes = 0;  // the parameters' (describe())
    std::map<std::string, size_t> index;     // leaf index by path
    std::vector<int> coordinate_group;       // the world devices at this process's pipeline coordinate
    // Sharded state (shard_state_): the layout of the shard a process holds (nullopt: held
    // whole), and the holders of this process's piece (its gradient's sum: the same
    // device of each stage that reads it).
    std::vector<std::optional<spmd::Sharding>> sharding;
    std::vector<std::vector<int>> peers;
  };
  std::optional<Placement> placement_;
  // Several processes and partitioned stages: the processes keep their device's shards
  // of the state (the header comment).
  bool shard_state_ = false;
  bool spmd_update_ = false;  // shard_state_ with an optimizer that reads whole matrices
  const Placement& placement_for(const Tree& params);
  // Sharded state: the leaves of `tree` that are sharded arrays as this process's shard
  // (plain arrays; the update program's inputs), and back (`like`: the tree they came from).
  Tree local_shards(const Tree& tree) const;
  Tree sharded_like(const Tree& local, const Tree& like) const;
  // The optimizer state's parameter-shaped slots selected the same way (other leaves as
  // they are), and back.
  Tree select_state(const Tree& state, const std::vector<bool>& keep) const;
  Tree merge_state(const Tree& state, const Tree& selected) const;

  // Created for the first call's argument structure (its donated leaves).
  Jitted& update_program(const Tree& args);
  // Replica r's rows of a micro-batch.
  data::Batch rows_of(const data::Batch& batch, int replica) const;
  static std::optional<models::Packing> packing_of(const data::Batch& rows);
  // 1, or with loss scaling the optimizer state's scale (the backward passes' seeds carry it).
  double loss_scale_of(const Tree& opt_state) const;
  // The update program on the gradient parts; the step's stats (loss_sum: the unscaled
  // losses of the accumulation steps, summed). Several processes: params and opt_state
  // are this process's selected leaves, `parts` their mean gradient, and squared_norm the
  // whole model's (Optimizer::apply).
  StepStats apply_update(Tree& params, Tree& opt_state, std::vector<Tree> parts, double lr, double loss_sum,
                         const Array& squared_norm = Array());
  // Runs fn(r) for every replica r: replica 0 on this thread, the others on their own
  // (device threads); rethrows the first failure.
  void for_each_replica(const std::function<void(int)>& fn) const;
  // Several processes: this process's part of the step, summed over the world.
  StepStats run_multi_process(Tree& params, Tree& opt_state, const std::vector<data::Batch>& micro, double lr,
                              const std::optional<Array>& key);
  // keys_of(key)[i][r]: the keys of the pipeline micro-batches of accumulation step i's
  // rows of replica r: part_keys(key, accumulation x R x m) in that order (one device's
  // accumulation keys); empty without a step key.
  std::vector<std::vector<std::vector<Array>>> keys_of(const std::optional<Array>& key) const;
};

}  // namespace tessera::train
