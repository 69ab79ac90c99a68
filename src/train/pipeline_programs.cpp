// PipelineExecutor's stages partitioned over the mesh's other axes (pipeline.h): their
// layouts, partitioned programs, gradient assembly and what they send; and the stages'
// programs as text or as graphs for the planner.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "tessera/compiler/compile.h"
#include "tessera/core/ops.h"
#include "tessera/nn/logical_sharding.h"
#include "tessera/nn/param.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/partitioner.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/pipeline.h"

namespace tessera::train {

std::string PipelineExecutor::per_run_line(const spmd::CommStats& stats) {
  spmd::CollectiveSummary summary;
  summary.per_device = stats;
  const std::string text = summary.text();
  // The summary counts one run of the program: here one micro-batch's pass.
  std::string line = text.substr(0, text.find('\n'));
  const std::string per_step = "collectives per step and device: ";
  if (line.starts_with(per_step)) line = "collectives per run and device: " + line.substr(per_step.size());
  return line;
}

Shape PipelineExecutor::micro_shape(const Shape& tokens_shape) const {
  if (tokens_shape.size() != 2 || tokens_shape[0] % schedule_.micro_batches != 0)
    fail<ShapeError>("pipeline: batches {} must be [batch, seq] with a batch that splits into {} micro-batches",
                     tessera::to_string(tokens_shape), schedule_.micro_batches);
  const Shape micro{tokens_shape[0] / schedule_.micro_batches, tokens_shape[1]};
  if (sharded() && micro[0] % layout_->data_parallel_size() != 0)
    fail<ValueError>(
        "pipeline: a pipeline micro-batch of {} rows does not split over the {} devices of the batch axes (mesh {}); "
        "use fewer pipeline micro-batches or a larger batch",
        micro[0], layout_->data_parallel_size(), options_.mesh.to_string());
  return micro;
}

std::pair<int, int> PipelineExecutor::coordinates(int device) const {
  const std::vector<int> c = options_.mesh.coords(device);
  return {c[static_cast<size_t>(pipeline_axis_)], options_.mesh.index_in_group(device, inner_axes_)};
}

spmd::Sharding PipelineExecutor::leaf_sharding(int stage, const std::string& path, const Array& leaf) const {
  const size_t dot = path.find('.');
  const std::string head = path.substr(0, dot);
  // A kept-activation program's "out": the stage's hand-over or loss, as the forward's.
  if (head == "out") return leaf_sharding(stage, path.substr(dot + 1), leaf);
  if (head == "p" || head == "dp") {
    // "layers.<i>.<rest>" of stage s is the model's layer first(s) + i.
    std::string rest = path.substr(dot + 1);
    if (rest.starts_with("layers.")) {
      const size_t end = rest.find('.', 7);
      const int i = std::stoi(rest.substr(7, end - 7));
      rest = fmt::format("layers.{}{}", stage_layers_[static_cast<size_t>(stage)].first + i,
                         end == std::string::npos ? "" : rest.substr(end));
    }
    return layout_->param(rest);
  }
  // Scalars, the step key and the routing figures (r, dr) are whole on every device.
  if (leaf.ndim() == 0 || head == "key" || head == "r" || head == "dr")
    return spmd::Sharding::replicated(options_.mesh, static_cast<int>(leaf.ndim()));
  return layout_->batch(leaf.ndim());
}

spmd::PartitionedProgram PipelineExecutor::partition_stage(int stage, const JitFn& fn, const Tree& args,
                                                           Tree* out_structure, ShardedProgram* layouts,
                                                           bool combine) const {
  compiler::Graph graph = trace(fn, args, {}, out_structure);
  graph.name = fmt::format("stage{}_{}", stage, args.items().count("dy") ? "backward" : "forward");
  spmd::PartitionOptions names;
  names.combine_all_reduces = combine;
  names.parameter_names = args.paths();
  names.output_names = out_structure->paths();
  std::vector<std::optional<spmd::Sharding>> in, out;
  const std::vector<Array> arg_leaves = args.leaves(), out_leaves = out_structure->leaves();
  for (size_t i = 0; i < arg_leaves.size(); ++i) {
    in.push_back(leaf_sharding(stage, names.parameter_names[i], arg_leaves[i]));
    if (layouts) layouts->in.emplace(names.parameter_names[i], *in.back());
  }
  for (size_t i = 0; i < out_leaves.size(); ++i) {
    // A loss (a scalar) is left to propagation: its partial sums are all-reduced.
    if (out_leaves[i].ndim() == 0) {
      out.emplace_back();
      continue;
    }
    out.push_back(leaf_sharding(stage, names.output_names[i], out_leaves[i]));
    if (layouts) layouts->out.emplace(names.output_names[i], *out.back());
  }
  return spmd::partition(graph, options_.mesh, in, out, names);
}

PipelineExecutor::ShardedProgram PipelineExecutor::partition_program(int stage, const JitFn& fn, const Tree& args,
                                                                     const std::vector<int>& inner) const {
  ShardedProgram program;
  const spmd::PartitionedProgram partitioned = partition_stage(stage, fn, args, &program.out_structure, &program);
  program.text = partitioned.text();
  program.collectives = per_run_line(partitioned.summary.per_device);
  program.collective_bytes = partitioned.summary.per_device.total_bytes();
  program.per_device.resize(static_cast<size_t>(inner_size_));
  for (int j : inner) {
    program.per_device[static_cast<size_t>(j)] =
        compiler::compile(partitioned.local, {}, std::vector<bool>(args.leaves().size(), false));
    program.peak_bytes = std::max(program.peak_bytes, program.per_device[static_cast<size_t>(j)]->stats().peak_bytes);
  }
  return program;
}

std::vector<PipelineExecutor::StageGraphs> PipelineExecutor::trace_stages(const Tree& params, const Shape& tokens_shape,
                                                                          bool packed) const {
  const int stages = schedule_.stages();
  const Shape micro = micro_shape(tokens_shape);
  std::optional<nn::LogicalShardingScope> scope;
  if (sharded()) scope.emplace(layout_->mesh(), layout_->rules());
  std::vector<Array> input{Array::placeholder(micro, DType::Int32)};
  std::vector<StageGraphs> out;
  for (int s = 0; s < stages; ++s) {
    StageGraphs g;
    Tree args = trace_args(params, s, input, micro, packed);
    // A device's part of the stage input (its rows over the batch axes when partitioned;
    // routing figures whole).
    for (size_t i = 0; i < input.size(); ++i) {
      const Array& a = input[i];
      const Shape local = sharded() ? leaf_sharding(s, i == 0 ? "x" : "r", a).local_shape(a.shape()) : a.shape();
      g.input_bytes += static_cast<double>(numel(local) * static_cast<int64_t>(itemsize(a.dtype())));
    }
    Tree y_structure, grads_structure;
    g.forward = sharded() ? partition_stage(s, forward_fn_[static_cast<size_t>(s)], args, &y_structure, nullptr).local
                          : trace(forward_fn_[static_cast<size_t>(s)], args, {}, &y_structure);
    g.forward_names = args.paths();
    const std::vector<Array> output = types_of(handed(y_structure, s == stages - 1));
    set_handed(args, output, true);
    if (keeps()) {
      // The forward keeps the activations its backward reads; the backward starts from them.
      KeptProgram k = kept_program(s, args, {});
      const std::vector<std::string> names = args.paths();
      g.backward_names.clear();
      g.residuals = k.split.residuals;
      for (size_t i = 0; i < k.split.residuals; ++i) {
        g.backward_names.push_back(fmt::format("residual.{}", i));
        g.residual_bytes += static_cast<double>(k.split.unknown.type(k.split.unknown.parameters[i]).nbytes());
      }
      for (size_t i : k.backward_parameters) g.backward_names.push_back(names[i]);
      g.forward = std::move(k.split.known);
      g.backward = std::move(k.split.unknown);
      out.push_back(std::move(g));
      input = output;
      continue;
    }
    g.backward = sharded()
                     ? partition_stage(s, backward_fn_[static_cast<size_t>(s)], args, &grads_structure, nullptr).local
                     : trace(backward_fn_[static_cast<size_t>(s)], args, {}, &grads_structure);
    g.backward_names = args.paths();
    out.push_back(std::move(g));
    input = output;
  }
  return out;
}

std::string PipelineExecutor::stage_summary() const {
  std::string text;
  auto peak_mib = [](const std::vector<std::unique_ptr<compiler::Executable>>& per_device) {
    size_t peak = 0;
    for (const auto& executable : per_device)
      if (executable) peak = std::max(peak, executable->stats().peak_bytes);
    return static_cast<double>(peak) / (1024.0 * 1024.0);
  };
  for (size_t s = 0; s < sharded_forward_.size(); ++s) {
    if (keeps()) {
      // The split programs that train (sharded_forward_ is evaluation's forward then).
      const KeptProgram& k = kept_[s];
      if (std::none_of(k.forward.begin(), k.forward.end(), [](const auto& e) { return e != nullptr; })) continue;
      text += fmt::format("stage {} forward (keeps activations): {}; peak memory per device {:.1f} MiB\n", s,
                          k.forward_collectives, peak_mib(k.forward));
      text += fmt::format("stage {} backward (from kept activations): {}; peak memory per device {:.1f} MiB\n", s,
                          k.backward_collectives, peak_mib(k.backward));
      continue;
    }
    for (const ShardedProgram* program : {&sharded_forward_[s], &sharded_backward_[s]}) {
      // With processes: only the stages this process runs.
      if (std::none_of(program->per_device.begin(), program->per_device.end(),
                       [](const auto& executable) { return executable != nullptr; }))
        continue;
      text += fmt::format("stage {} {}: {}; peak memory per device {:.1f} MiB\n", s,
                          program == &sharded_forward_[s] ? "forward" : "backward", program->collectives,
                          static_cast<double>(program->peak_bytes) / (1024.0 * 1024.0));
    }
  }
  return text;
}

double PipelineExecutor::analytic_collective_bytes(int64_t batch, int64_t seq) const {
  if (!sharded()) return 0;
  const int stages = schedule_.stages();
  const bool tied = model_.config().resolved_tied();
  double bytes = 0;
  for (int s = 0; s < stages; ++s) {
    // Plain copies, not structured bindings: clang 14 cannot capture those in a lambda.
    const int first = stage_layers_[static_cast<size_t>(s)].first;
    const int last = stage_layers_[static_cast<size_t>(s)].second;
    const bool embedding = s == 0, head = s == stages - 1;
    Layout::PartBytes part;
    part.layers = last - first;
    part.embedding = embedding;
    part.head = head;
    // The parameters the stage reads.
    part.includes = [first, last, embedding, head, tied](const std::string& path) {
      return stage_reads(path, {first, last}, embedding, head, tied);
    };
    if (!head) part.output_bias = fmt::format("layers.{}.mlp.proj.b", last - 1);  // GPT's blocks end with it
    const int64_t rows = batch / schedule_.micro_batches, dim = model_.config().dim;
    if (keeps()) {
      // The backward reads the weights and norm scales (for the input gradients), not the
      // biases or norm shifts (added: their gradients need not their values), nor the
      // embeddings the first stage looks up (a tied embedding is the last stage's head: read).
      part.read_by_backward = [head, tied, specs = model_.specs()](const std::string& path) {
        if (path == "wte") return head && tied;
        const nn::ParamKind kind = specs.at(path).kind;
        return kind == nn::ParamKind::Weight || (kind == nn::ParamKind::Norm && !path.ends_with(".bias"));
      };
      bytes += schedule_.micro_batches * inner_size_ * layout_->analytic_kept_part_bytes(part, dim, rows, seq);
    } else {
      bytes += schedule_.micro_batches * inner_size_ * layout_->analytic_recomputed_part_bytes(part, dim, rows, seq);
    }
  }
  return bytes;
}

std::string PipelineExecutor::text() const {
  std::string text = fmt::format(
      "pipeline: {} schedule, {} devices x {} virtual stages, {} micro-batches{}\n", to_string(schedule_.kind),
      schedule_.devices, schedule_.virtual_stages, schedule_.micro_batches,
      sharded() ? fmt::format(", each stage on {} devices of mesh {}", inner_size_, options_.mesh.to_string()) : "");
  if (compiled_tokens_.empty()) return text + "(not compiled yet: call compile() or run())\n";
  for (size_t s = 0; s < stage_layers_.size(); ++s) {
    text += fmt::format("\n== stage {} (pipeline device {}): layers {}-{} ==\n", s,
                        static_cast<int>(s) % schedule_.devices, stage_layers_[s].first, stage_layers_[s].second - 1);
    // With processes, another process's stages were not compiled here.
    const std::string elsewhere = "(runs in another process)\n";
    const bool partitioned = sharded() && !keeps();  // kept activations: the split programs' text
    const std::string& forward = partitioned ? sharded_forward_[s].text : traced_text_[2 * s];
    const std::string& backward = partitioned ? sharded_backward_[s].text : traced_text_[2 * s + 1];
    text += "-- forward --\n" + (forward.empty() ? elsewhere : forward);
    text += "-- backward --\n" + (backward.empty() ? elsewhere : backward);
  }
  return text;
}

std::optional<spmd::Sharding> PipelineExecutor::param_sharding(const std::string& path) const {
  if (!sharded()) return std::nullopt;
  return layout_->param(path);
}

Array PipelineExecutor::whole_from_shard(const Array& shard, const Shape& shape, DType dtype,
                                         const spmd::Sharding& sharding) const {
  const spmd::Mesh& mesh = options_.mesh;
  const int me = spmd::local_devices().front();
  // The stage's devices swap their shards (equal sizes), ordered by index among them.
  std::vector<char> all(shard.nbytes() * static_cast<size_t>(inner_size_));
  spmd::communicator().all_gather(me, mesh.group(me, inner_axes_), shard.raw_data(), all.data(), shard.nbytes());
  std::vector<Array> by_inner(static_cast<size_t>(inner_size_));
  for (int j = 0; j < inner_size_; ++j)
    by_inner[static_cast<size_t>(j)] =
        Array::from_data(all.data() + shard.nbytes() * static_cast<size_t>(j), shard.shape(), shard.dtype());
  return whole_from_inner(by_inner, shape, dtype, sharding);
}

Array PipelineExecutor::whole_from_inner(const std::vector<Array>& by_inner, const Shape& shape, DType dtype,
                                         const spmd::Sharding& sharding) const {
  const spmd::Mesh& mesh = options_.mesh;
  // Every pipeline coordinate gets the stage's shards (the array is replicated there), so
  // the sharded array is whole in this process.
  std::vector<Array> shards(static_cast<size_t>(mesh.size()));
  for (int dev = 0; dev < mesh.size(); ++dev)
    shards[static_cast<size_t>(dev)] = by_inner[static_cast<size_t>(coordinates(dev).second)];
  const Array sharded = spmd::make_sharded(shape, dtype, sharding, std::move(shards));
  (void)spmd::gather(sharded);
  return Array::from_data(sharded.raw_data(), shape, dtype);
}

Tree PipelineExecutor::assemble_stage_grads(int s, const Tree& whole,
                                            const std::vector<std::optional<Tree>>& accumulated, int j_here) const {
  const int inner = inner_size_;
  const std::vector<std::string> paths = whole.paths();
  std::vector<Array> leaves = whole.leaves();
  std::vector<std::vector<Array>> local(static_cast<size_t>(inner));
  for (int j = 0; j < inner; ++j) {
    const std::optional<Tree>& acc = accumulated[static_cast<size_t>(s * inner + j)];
    if (acc) local[static_cast<size_t>(j)] = acc->leaves();
  }
  const int me = j_here < 0 ? -1 : spmd::local_devices().front();
  for (size_t i = 0; i < leaves.size(); ++i) {
    const spmd::Sharding& sharding = sharded_backward_[static_cast<size_t>(s)].out.at("dp." + paths[i]);
    const Shape shape = leaves[i].shape();
    const DType dtype = leaves[i].dtype();
    if (j_here >= 0 && options_.gradient_shards) {
      // This device's shard, complete for its piece (the programs reduced it over the
      // stage's batch axes).
      std::vector<Array> shards(static_cast<size_t>(options_.mesh.size()));
      shards[static_cast<size_t>(me)] = local[static_cast<size_t>(j_here)].at(i);
      leaves[i] = spmd::make_sharded(shape, dtype, sharding, std::move(shards));
      continue;
    }
    if (j_here < 0) {
      std::vector<Array> by_inner(static_cast<size_t>(inner));
      for (int j = 0; j < inner; ++j) by_inner[static_cast<size_t>(j)] = local[static_cast<size_t>(j)].at(i);
      leaves[i] = whole_from_inner(by_inner, shape, dtype, sharding);
      continue;
    }
    // One process per device: whole on each of the stage's devices; only index 0 returns it
    // (the others zeros, so that a sum over the processes counts it once).
    const Array assembled = whole_from_shard(local[static_cast<size_t>(j_here)].at(i), shape, dtype, sharding);
    leaves[i] = j_here > 0 ? zeros(shape, dtype).eval() : assembled;
  }
  return whole.with_leaves(leaves);
}

}  // namespace tessera::train
