// Parallel layouts for training (MaxText's logical axis rules over a named mesh).
//
// Every parameter declares one logical axis name per dimension ("embed", "heads",
// "mlp", "vocab", ... see nn/param.h). A rule maps a logical axis to mesh axes; a
// parameter dimension is split over the mesh axes its logical axis maps to (axes
// absent from the mesh, of size 1, or already used by an earlier dimension of the
// same parameter are skipped). Batches are split over the "batch" rule's axes.
//
// With the default rules and the MaxText axis names:
//   data=N     data parallel: parameters replicated, gradients all-reduced
//   fsdp=N     FSDP / ZeRO-3: parameters, gradients and optimizer state split over
//              fsdp ("embed" and "norm" dims), all-gathered before use, gradients
//              reduce-scattered
//   tensor=N   Megatron tensor parallel: attention heads, the MLP hidden dim and the
//              vocabulary (embedding, output head, loss) split
//   and any product of them, e.g. data=2,fsdp=2,tensor=2.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/tree.h"
#include "tessera/data/loader.h"
#include "tessera/nn/param.h"
#include "tessera/spmd/sharding.h"

namespace tessera::train {

// Logical axis -> mesh axes (major first).
using AxisRules = std::map<std::string, std::vector<std::string>>;

// batch -> (data, fsdp, expert); embed, norm -> fsdp; heads, kv_heads, mlp, vocab ->
// tensor (Megatron: vocabulary-parallel embedding and loss); experts (a mixture of
// experts' weights and expert buffers, nn/moe.h) -> expert; moe_groups (the routing
// groups while their tokens are at the experts) -> (data, fsdp); position, head_dim ->
// not split.
AxisRules default_axis_rules();
// "embed=fsdp,heads=tensor,batch=data+fsdp" (entries override the defaults; an empty
// right side, "vocab=", means not split). Throws ConfigError naming the entry.
AxisRules parse_axis_rules(const std::string& text, const AxisRules& base = default_axis_rules());

// Where parameters, optimizer state and batches live on a mesh. One device is a
// 1-device mesh (one_device()): partitioning onto one device splits nothing and
// inserts no collectives, so its placement is the identity and its programs are the
// plain ones (tests/spmd/test_parallel_train.cpp shows them bitwise equal to the
// partitioned program on that mesh). The trainer therefore always has a layout.
class Layout {
 public:
  Layout(spmd::Mesh mesh, AxisRules rules, nn::ParamSpecs specs);
  // The 1-device mesh (data=1) with the default rules.
  static Layout one_device(nn::ParamSpecs specs);

  const spmd::Mesh& mesh() const { return mesh_; }
  const AxisRules& rules() const { return rules_; }
  // The sharding of parameter `path` (ConfigError if unknown or not divisible).
  const spmd::Sharding& param(const std::string& path) const;
  // Batches [B, ...]: dim 0 over the batch axes.
  spmd::Sharding batch(int rank) const;
  // Devices that each hold a different slice of the batch.
  int64_t data_parallel_size() const;
  // A 1-device mesh: every placement below is the identity and shardings_for gives
  // no layouts, so jit compiles the unpartitioned program.
  bool splits_nothing() const { return mesh_.size() == 1; }

  // Layouts for the leaves of a tree with keys params.* / grads.* (parameters),
  // opt.<slot>.* (optimizer moments, like their parameter), opt.step (replicated),
  // tokens / targets (batch); other leaves: nullopt (follow propagation).
  std::vector<std::optional<spmd::Sharding>> shardings_for(const Tree& tree) const;

  Tree shard_params(const Tree& params) const;
  Tree shard_opt_state(const Tree& opt_state) const;
  data::Batch shard_batch(const data::Batch& batch) const;
  // The next batch of `loader`, placed: in-process the global batch is read and split;
  // under MPI each process reads only the rows of its own devices' shards.
  data::Batch next_batch(data::BatchStream& loader, int64_t batch) const;
  // Host copies (checkpoints): every leaf gathered.
  static Tree gather(const Tree& tree);

  // One line per parameter: path, shape, layout.
  std::string describe() const;

  // Bytes each device should send per optimizer step (one micro-batch) for a GPT of
  // `layers` blocks and width `dim` on batches [batch, seq] (ring counts, see
  // spmd::CommStats), from the layouts alone:
  //   parameter p of b bytes, split over tensor axes into b_t per device:
  //     split over batch axes F (FSDP): all-gather F (of the position table "wpe" only
  //       the first `seq` rows, which a step reads) + reduce-scatter F of b_t, then
  //       all-reduce over the other batch axes of b_t / |F|;
  //     else: all-reduce of the gradient over the batch axes;
  //   tensor parallel (t devices): 4 all-reduces per block of the [batch / dp, seq,
  //   dim] activations (attention and MLP outputs forward, their inputs' gradients
  //   backward);
  //   vocabulary split over v devices: 2 more such all-reduces (the lookup, the head's
  //   input gradient) and the loss's all-gather of [rows] maxima and 2 all-reduces of
  //   [rows] sums.
  // Scalar reductions (the loss and its token count) are not counted.
  double analytic_step_bytes(int64_t layers, int64_t dim, int64_t batch, int64_t seq) const;

  // The same count for part of the model run as its own programs: a pipeline stage
  // (train/pipeline.h) runs a forward and a backward program per micro-batch, and the
  // backward recomputes the forward. Per device and micro-batch of `batch` rows:
  //   parameters whose path `includes` accepts: FSDP all-gathers in the forward and again
  //     in the recomputed forward, the reduce-scatter of the gradient, and the all-reduce
  //     over the other batch axes, each micro-batch;
  //   `layers` blocks under tensor parallelism: 6 activation all-reduces (2 forward, 2
  //     recomputed, 2 input gradients);
  //   vocabulary split: with the embedding, its lookup's all-reduce twice (forward and
  //     recomputed); with the head, its input gradient's all-reduce, the loss's all-gather
  //     of row maxima and all-reduce of sums twice, its all-reduce of target logits once
  //     (the gradient does not need the loss's value).
  // Without the head, the part's output is an activation whose value the backward does
  // not need: the recompute leaves out its last all-reduce under tensor parallelism and
  // the all-gather of `output_bias`, the bias added last (if the model has it).
  struct PartBytes {
    std::function<bool(const std::string& path)> includes;
    int64_t layers = 0;
    bool embedding = false, head = false;
    std::string output_bias;
    // analytic_kept_part_bytes: the parameters the backward reads (all-gathered again).
    std::function<bool(const std::string& path)> read_by_backward;
  };
  double analytic_recomputed_part_bytes(const PartBytes& part, int64_t dim, int64_t batch, int64_t seq) const;
  // The part's forward keeps the activations its backward reads (PipelineOptions::recompute
  // = false): nothing is recomputed, but the backward all-gathers again the FSDP-split
  // parameters `read_by_backward` accepts (a weight for its input gradient; not a bias):
  // those 2 all-gathers, the others 1; 4 activation all-reduces per block under tensor
  // parallelism; the vocabulary split's forward collectives once.
  double analytic_kept_part_bytes(const PartBytes& part, int64_t dim, int64_t batch, int64_t seq) const;

 private:
  std::optional<spmd::Sharding> leaf_sharding(const std::string& path, const Array& leaf) const;
  // analytic_step_bytes and analytic_recomputed_part_bytes: `recompute` counts what a
  // recomputed forward repeats.
  double analytic_bytes(const PartBytes& part, int64_t dim, int64_t batch, int64_t seq, bool recompute) const;
  spmd::Mesh mesh_;
  AxisRules rules_;
  nn::ParamSpecs specs_;
  std::map<std::string, spmd::Sharding> params_;
};

}  // namespace tessera::train
