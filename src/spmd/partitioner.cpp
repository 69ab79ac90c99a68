#include "tessera/spmd/partitioner.h"

#include <fmt/format.h>

#include <map>
#include <unordered_set>

#include "compiler/lazy_graph.h"
#include "spmd/combine_all_reduces.h"
#include "tessera/core/checkpoint.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/collectives.h"
#include "tessera/spmd/ragged_all_to_all.h"
#include "tessera/spmd/reshard.h"
#include "tessera/spmd/sharding_rule.h"

namespace tessera::spmd {

namespace {

using compiler::Graph;
using compiler::Node;
using compiler::TensorType;
using compiler::ValueId;

std::string node_text(const Graph& g, const Node& n) {
  std::string s = n.primitive->name() + "(";
  for (size_t i = 0; i < n.inputs.size(); ++i) s += (i ? ", " : "") + compiler::to_string(g.type(n.inputs[i]));
  s += ")";
  std::string attrs = n.primitive->attributes();
  if (!attrs.empty()) s += " {" + attrs + "}";
  return s;
}

class Partitioner {
 public:
  Partitioner(const Graph& global, const Mesh& mesh, const PartitionOptions& options)
      : g_(global), mesh_(mesh), options_(options), local_(global.values.size()), sharding_(global.values.size()) {}

  PartitionedProgram run(const std::vector<std::optional<Sharding>>& in,
                         const std::vector<std::optional<Sharding>>& out);

 private:
  std::string parameter_name(size_t i) const {
    if (i < options_.parameter_names.size() && !options_.parameter_names[i].empty())
      return fmt::format("argument {} ({})", i, options_.parameter_names[i]);
    return fmt::format("argument {}", i);
  }
  std::string output_name(size_t i) const {
    if (i < options_.output_names.size() && !options_.output_names[i].empty())
      return fmt::format("output {} ({})", i, options_.output_names[i]);
    return fmt::format("output {}", i);
  }
  // The local shard of global value v laid out as `to` (collectives inserted once per
  // value and layout).
  Array value_as(ValueId v, const Sharding& to, const std::string& why);
  void apply(const Node& node);
  // Layout hints for partial sums, propagated backward from where their layout is
  // known: the optimizer update wants a gradient laid out like its parameter, an
  // output its requested layout; elementwise ops pass hints to same-shaped operands.
  void compute_hints(const std::vector<std::optional<Sharding>>& out);
  // A partial sum read by several ops is reduced once, where first read, to its hint
  // (reduce-scatter when the hint splits it) or else replicated; all later readers
  // see the reduced value. Single readers keep it partial (linear ops pass it on).
  void settle_partial(ValueId v);
  // The local op keeps the node's rematerialization region and name. The collectives
  // (and copies) that bring an op of a region its operand belong to that region too
  // (stamp_reshard), so the backward pass redoes them with the region instead of
  // holding their results from the forward: as in FSDP, a layer's weights are gathered
  // again; under tensor parallelism, a partial sum is reduced again.
  void stamp_remat(const Node& node, const std::vector<Array>& outs);
  void stamp_reshard(const Node& node, const Array& source, const Array& resharded);
  int local_region(int graph_region);
  std::map<int, int> remat_regions_;              // graph region -> region id of the local ops
  std::unordered_set<const void*> node_results_;  // local results of graph nodes (their ArrayImpl)

  const Graph& g_;
  Mesh mesh_;
  const PartitionOptions& options_;
  std::vector<Array> local_;
  std::vector<Sharding> sharding_;
  std::map<std::pair<ValueId, std::string>, Array> resharded_;
  std::vector<Array> placeholders_;
  CollectiveSummary summary_;
  std::vector<std::optional<Sharding>> hint_;
  std::vector<int> readers_;
};

bool passes_hint(const std::string& name) {
  static const char* const linear[] = {"add", "subtract", "multiply", "divide",        "negative",
                                       "neg", "convert",  "identity", "stop_gradient", "copy"};
  for (const char* n : linear)
    if (name == n) return true;
  return false;
}

void Partitioner::compute_hints(const std::vector<std::optional<Sharding>>& out) {
  hint_.assign(g_.values.size(), std::nullopt);
  readers_.assign(g_.values.size(), 0);
  for (const Node& n : g_.nodes)
    if (!n.dead)
      for (ValueId v : n.inputs) ++readers_[static_cast<size_t>(v)];
  for (size_t o = 0; o < g_.outputs.size(); ++o) {
    ++readers_[static_cast<size_t>(g_.outputs[o])];
    if (o < out.size() && out[o]) hint_[static_cast<size_t>(g_.outputs[o])] = out[o];
  }
  // The parameter a value is a renamed copy of (identity, stop_gradient), or -1.
  auto parameter_sharding = [&](ValueId v) -> std::optional<Sharding> {
    for (int guard = 0; guard < 16; ++guard) {
      const Node* p = g_.producer(v);
      if (p == nullptr) break;
      std::string name = p->primitive->name();
      if (name != "identity" && name != "stop_gradient") break;
      v = p->inputs[0];
    }
    if (g_.value(v).kind == compiler::ValueKind::Parameter) return sharding_[static_cast<size_t>(v)];
    return std::nullopt;
  };
  for (auto it = g_.nodes.rbegin(); it != g_.nodes.rend(); ++it) {
    const Node& n = *it;
    if (n.dead) continue;
    std::string name = n.primitive->name();
    if (name == "adamw_update" || name == "lion_update") {
      // The gradient and the moments (inputs 1 to 3 of AdamW, 1 and 2 of Lion) take the
      // parameter's layout.
      const size_t elementwise = name == "adamw_update" ? 4 : 3;
      std::optional<Sharding> param = parameter_sharding(n.inputs[0]);
      if (param)
        for (size_t i = 1; i < elementwise && i < n.inputs.size(); ++i) {
          auto& h = hint_[static_cast<size_t>(n.inputs[i])];
          if (!h) h = param->without_partial();
        }
      continue;
    }
    const auto& out_hint = hint_[static_cast<size_t>(n.outputs[0])];
    if (!out_hint || n.outputs.size() != 1 || !passes_hint(name)) continue;
    for (ValueId v : n.inputs) {
      auto& h = hint_[static_cast<size_t>(v)];
      if (!h && g_.type(v).shape == g_.type(n.outputs[0]).shape) h = out_hint->without_partial();
    }
  }
}

int Partitioner::local_region(int graph_region) {
  auto it = remat_regions_.find(graph_region);
  if (it == remat_regions_.end())
    it = remat_regions_
             .emplace(graph_region,
                      tessera::detail::new_checkpoint_region(g_.remat_regions.at(static_cast<size_t>(graph_region))))
             .first;
  return it->second;
}

void Partitioner::stamp_reshard(const Node& node, const Array& source, const Array& resharded) {
  if (node.remat_region < 0) return;
  // The ops the reshard made, from `resharded` back to `source`; it stops at the local
  // result of another graph node (stamped with that node) and at ops already in a region.
  std::vector<std::shared_ptr<tessera::detail::OpNode>> made;
  std::vector<Array> frontier = {resharded};
  while (!frontier.empty()) {
    const Array a = frontier.back();
    frontier.pop_back();
    const auto& op = a.impl()->op;
    if (a.impl() == source.impl() || !op || op->remat_region >= 0 || !op->remat_name.empty() ||
        node_results_.count(a.impl()))
      continue;
    made.push_back(op);
    for (const Array& in : op->inputs) frontier.push_back(in);
  }
  if (made.empty()) return;
  const int region = local_region(node.remat_region);
  for (const auto& op : made) op->remat_region = region;
}

void Partitioner::stamp_remat(const Node& node, const std::vector<Array>& outs) {
  if (node.remat_region < 0 && node.remat_name.empty()) return;
  const int region = node.remat_region >= 0 ? local_region(node.remat_region) : -1;
  for (const Array& o : outs) {
    const auto& op = o.impl()->op;
    if (!op) continue;
    op->remat_region = region;
    op->remat_name = node.remat_name;
  }
}

void Partitioner::settle_partial(ValueId v) {
  const Sharding& s = sharding_[static_cast<size_t>(v)];
  if (!s.is_partial() || readers_[static_cast<size_t>(v)] < 2) return;
  Sharding to = s.without_partial();
  if (const auto& h = hint_[static_cast<size_t>(v)]; h && h->rank() == s.rank()) {
    // The hint's splits, where they do not fight the value's own.
    to = *h;
    bool compatible = true;
    for (int d = 0; d < s.rank(); ++d)
      if (!s.dim_axes(d).empty() && s.dim_axes(d) != h->dim_axes(d)) compatible = false;
    if (!compatible) to = s.without_partial();
  }
  Array reduced = value_as(v, to, "partial sum read by several ops");
  local_[static_cast<size_t>(v)] = reduced;
  sharding_[static_cast<size_t>(v)] = to;
}

Array Partitioner::value_as(ValueId v, const Sharding& to, const std::string& why) {
  const Sharding& from = sharding_[static_cast<size_t>(v)];
  if (from == to) return local_[static_cast<size_t>(v)];
  auto key = std::make_pair(v, to.to_string());
  auto it = resharded_.find(key);
  if (it != resharded_.end()) return it->second;
  const Shape& global = g_.type(v).shape;
  to.check_divisible(global, why);
  Array result;
  // A replicated broadcast that is needed split is broadcast again at the local shape
  // when every split dim is one the broadcast creates (no data to slice).
  const Node* producer = g_.producer(v);
  if (from.is_replicated() && !to.is_partial() && producer != nullptr &&
      producer->primitive->name() == "broadcast_to" &&
      sharding_[static_cast<size_t>(producer->inputs[0])].is_replicated()) {
    const Shape& in = g_.type(producer->inputs[0]).shape;
    int offset = static_cast<int>(global.size() - in.size());
    bool all_broadcast = true;
    for (int d = 0; d < to.rank(); ++d) {
      if (to.dim_axes(d).empty()) continue;
      int di = d - offset;
      all_broadcast = all_broadcast && (di < 0 || in[static_cast<size_t>(di)] == 1);
    }
    if (all_broadcast) {
      Shape local_shape = to.local_shape(global, why);
      result = Array::make(local_shape, g_.type(v).dtype, std::make_shared<BroadcastTo>(local_shape),
                           {local_[static_cast<size_t>(producer->inputs[0])]});
    }
  }
  // A transposed (or renamed) value is resharded before the layout op, so a parameter
  // used both ways (a tied embedding) is gathered once.
  if (!result.valid() && producer != nullptr && !from.is_partial() && !to.is_partial()) {
    std::string name = producer->primitive->name();
    if (name == "transpose") {
      const auto& perm = static_cast<const Transpose&>(*producer->primitive).perm();
      Sharding before = Sharding::replicated(mesh_, to.rank());
      for (int d = 0; d < to.rank(); ++d) before = before.with_dim_axes(perm[static_cast<size_t>(d)], to.dim_axes(d));
      Array in = value_as(producer->inputs[0], before, why);
      result = Array::make(to.local_shape(global, why), g_.type(v).dtype, producer->primitive, {in});
    } else if ((name == "identity" || name == "stop_gradient") &&
               sharding_[static_cast<size_t>(producer->inputs[0])] == from) {
      result = value_as(producer->inputs[0], to, why);
    }
  }
  if (!result.valid()) {
    std::vector<ReshardStep> steps;
    result = reshard_local(local_[static_cast<size_t>(v)], global, from, to, &steps);
    for (const ReshardStep& s : steps) summary_.lines.push_back(s.description + "  # " + why);
  }
  resharded_.emplace(key, result);
  return result;
}

void Partitioner::apply(const Node& node) {
  const Primitive& prim = *node.primitive;
  std::string where = node_text(g_, node);
  std::vector<Array> before_settle;  // the operands' local values before partial sums are reduced
  for (ValueId v : node.inputs) before_settle.push_back(local_[static_cast<size_t>(v)]);
  for (ValueId v : node.inputs) settle_partial(v);
  std::vector<Sharding> in;
  for (ValueId v : node.inputs) in.push_back(sharding_[static_cast<size_t>(v)]);

  if (const auto* constraint = dynamic_cast<const ShardingConstraint*>(&prim)) {
    Sharding to = constraint->sharding();
    if (to.mesh() != mesh_)
      fail<ShardingError>("sharding {}: with_sharding_constraint on mesh {} inside a program on mesh {}", where,
                          to.mesh().to_string(), mesh_.to_string());
    ValueId o = node.outputs[0];
    local_[static_cast<size_t>(o)] = value_as(node.inputs[0], to, "with_sharding_constraint");
    sharding_[static_cast<size_t>(o)] = to;
    stamp_reshard(node, before_settle[0], local_[static_cast<size_t>(o)]);
    node_results_.insert(local_[static_cast<size_t>(o)].impl());
    return;
  }

  bool replicated = true;
  for (const Sharding& s : in) replicated = replicated && s.is_replicated();
  std::vector<Array> local_in;
  if (replicated) {
    // Every device computes the whole value: the op runs unchanged.
    for (ValueId v : node.inputs) local_in.push_back(local_[static_cast<size_t>(v)]);
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    for (ValueId o : node.outputs) shapes.push_back(g_.type(o).shape), dtypes.push_back(g_.type(o).dtype);
    std::vector<Array> outs = Array::make(shapes, dtypes, node.primitive, local_in);
    stamp_remat(node, outs);
    for (size_t o = 0; o < outs.size(); ++o) {
      local_[static_cast<size_t>(node.outputs[o])] = outs[o];
      sharding_[static_cast<size_t>(node.outputs[o])] = Sharding::replicated(mesh_, static_cast<int>(shapes[o].size()));
      node_results_.insert(outs[o].impl());
    }
    return;
  }

  const ShardingRule* rule = find_sharding_rule(prim);
  if (rule == nullptr) {
    std::string layouts;
    for (const Sharding& s : in) layouts += (layouts.empty() ? "" : ", ") + s.to_string();
    fail<ShardingError>(
        "sharding {}: op '{}' has no sharding rule and its operands are split ({}); make them replicated with "
        "with_sharding_constraint, or register a sharding rule for the primitive",
        where, prim.name(), layouts);
  }
  ShardingRule::Context context{prim, mesh_, {}, {}, in, where};
  for (ValueId v : node.inputs) context.in_types.push_back(g_.type(v));
  for (ValueId o : node.outputs) context.out_types.push_back(g_.type(o));
  ShardingRule::Decision d = rule->decide(context);
  if (d.inputs.size() != node.inputs.size() || d.outputs.size() != node.outputs.size())
    fail<ShardingError>("sharding {}: the rule of '{}' returned {} input and {} output layouts (expected {} and {})",
                        where, prim.name(), d.inputs.size(), d.outputs.size(), node.inputs.size(), node.outputs.size());
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    local_in.push_back(value_as(node.inputs[i], d.inputs[i], fmt::format("operand {} of {}", i, prim.name())));
    stamp_reshard(node, before_settle[i], local_in.back());
  }
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const TensorType& t = g_.type(node.outputs[o]);
    shapes.push_back(d.outputs[o].local_shape(t.shape, fmt::format("output {} of {}", o, where)));
    dtypes.push_back(t.dtype);
  }
  std::vector<Array> outs =
      d.expand ? d.expand(local_in) : Array::make(shapes, dtypes, d.local ? d.local : node.primitive, local_in);
  stamp_remat(node, outs);
  for (size_t o = 0; o < outs.size(); ++o) {
    if (outs[o].shape() != shapes[o] || outs[o].dtype() != dtypes[o])
      fail<ShardingError>("sharding {}: local output {} is {} but the layout {} needs {}", where, o,
                          type_string(outs[o]), d.outputs[o].to_string(), tessera::to_string(shapes[o]));
    local_[static_cast<size_t>(node.outputs[o])] = outs[o];
    sharding_[static_cast<size_t>(node.outputs[o])] = d.outputs[o];
    node_results_.insert(outs[o].impl());
  }
}

PartitionedProgram Partitioner::run(const std::vector<std::optional<Sharding>>& in,
                                    const std::vector<std::optional<Sharding>>& out) {
  if (in.size() != g_.parameters.size())
    fail<ValueError>("partition: {} parameter shardings for {} parameters", in.size(), g_.parameters.size());
  if (!out.empty() && out.size() != g_.outputs.size())
    fail<ValueError>("partition: {} output shardings for {} outputs", out.size(), g_.outputs.size());
  PartitionedProgram program;
  program.mesh = mesh_;
  for (size_t i = 0; i < g_.parameters.size(); ++i) {
    ValueId v = g_.parameters[i];
    const TensorType& t = g_.type(v);
    Sharding s = in[i] ? *in[i] : Sharding::replicated(mesh_, static_cast<int>(t.shape.size()));
    if (s.mesh() != mesh_)
      fail<ShardingError>("partition: {} is sharded over mesh {} but the program runs on mesh {}", parameter_name(i),
                          s.mesh().to_string(), mesh_.to_string());
    if (s.rank() != static_cast<int>(t.shape.size()))
      fail<ShardingError>("partition: {} has shape {} but its sharding {} is for rank {}", parameter_name(i),
                          tessera::to_string(t.shape), s.to_string(), s.rank());
    Shape local_shape = s.local_shape(t.shape, parameter_name(i));
    Array p = Array::placeholder(local_shape, t.dtype);
    placeholders_.push_back(p);
    local_[static_cast<size_t>(v)] = p;
    sharding_[static_cast<size_t>(v)] = s;
    program.parameter_shardings.push_back(s);
    program.global_parameter_types.push_back(t);
  }
  for (size_t v = 0; v < g_.values.size(); ++v) {
    const compiler::Value& value = g_.values[v];
    if (value.dead || value.kind != compiler::ValueKind::Constant) continue;
    local_[v] = value.constant;
    sharding_[v] = Sharding::replicated(mesh_, static_cast<int>(value.type.shape.size()));
  }
  compute_hints(out);
  for (const Node& node : g_.nodes)
    if (!node.dead) apply(node);

  std::vector<Array> outputs;
  for (size_t o = 0; o < g_.outputs.size(); ++o) {
    ValueId v = g_.outputs[o];
    Sharding to = !out.empty() && out[o] ? *out[o] : sharding_[static_cast<size_t>(v)].without_partial();
    if (to.mesh() != mesh_)
      fail<ShardingError>("partition: {} is requested on mesh {} but the program runs on mesh {}", output_name(o),
                          to.mesh().to_string(), mesh_.to_string());
    outputs.push_back(value_as(v, to, output_name(o)));
    program.output_shardings.push_back(to);
    program.global_output_types.push_back(g_.type(v));
  }
  compiler::LazyGraph lg = compiler::build_lazy_graph(
      outputs, placeholders_, compiler::CapturedArrays::AsConstants, [](const Array& root, const Array& leaf) {
        fail<ShardingError>("partition: internal error: local value {} depends on an unknown placeholder {}",
                            type_string(root), type_string(leaf));
      });
  for (const Array& o : outputs) lg.graph.outputs.push_back(lg.value_of(o));
  lg.graph.name = g_.name;
  program.local = std::move(lg.graph);
  if (options_.combine_all_reduces)
    if (int combined = combine_all_reduces(program.local); combined > 0)
      summary_.lines.push_back(
          fmt::format("({} groups of small independent all-reduces combined into one call each)", combined));
  summary_.per_device = collective_stats(program.local);  // the summary's per-step figures
  program.summary = std::move(summary_);
  return program;
}

std::string bytes_text(double b) {
  if (b >= 1024.0 * 1024.0) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024.0));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

}  // namespace

CommStats collective_stats(const Graph& local) {
  CommStats s;
  for (const Node& n : local.nodes) {
    if (n.dead) continue;
    if (const auto* r = dynamic_cast<const RaggedAllToAll*>(n.primitive.get())) {
      // Planned at its balanced-routing figure; a run counts the rows that really moved.
      const ValueId groups_side = r->combine() ? n.outputs[0] : n.inputs[0];
      ++s.all_to_all_calls,
          s.all_to_all_bytes += r->planned_bytes(static_cast<double>(local.type(groups_side).nbytes()));
      continue;
    }
    const auto* c = dynamic_cast<const Collective*>(n.primitive.get());
    if (c == nullptr) continue;
    const double bytes = c->bytes_sent(static_cast<double>(local.type(n.inputs[0]).nbytes()));
    switch (c->kind()) {
      case CollectiveKind::AllGather:
        ++s.all_gather_calls, s.all_gather_bytes += bytes;
        break;
      case CollectiveKind::AllReduce:
        ++s.all_reduce_calls, s.all_reduce_bytes += bytes;
        break;
      case CollectiveKind::ReduceScatter:
        ++s.reduce_scatter_calls, s.reduce_scatter_bytes += bytes;
        break;
      case CollectiveKind::AllToAll:
        ++s.all_to_all_calls, s.all_to_all_bytes += bytes;
        break;
      default:  // local slicing and padding move no data
        break;
    }
  }
  return s;
}

std::string CollectiveSummary::text() const {
  const CommStats& s = per_device;
  std::string t = fmt::format(
      "collectives per step and device: all_gather {} ({}), all_reduce {} ({}), reduce_scatter {} ({}), all_to_all {} "
      "({}); total {}\n",
      s.all_gather_calls, bytes_text(s.all_gather_bytes), s.all_reduce_calls, bytes_text(s.all_reduce_bytes),
      s.reduce_scatter_calls, bytes_text(s.reduce_scatter_bytes), s.all_to_all_calls, bytes_text(s.all_to_all_bytes),
      bytes_text(s.total_bytes()));
  for (const std::string& line : lines) t += "  " + line + "\n";
  return t;
}

std::string PartitionedProgram::text() const {
  std::string t = fmt::format("// SPMD program for one device of mesh {}\n", mesh.to_string());
  for (size_t i = 0; i < parameter_shardings.size(); ++i)
    t += fmt::format("//   argument {}: {} {}\n", i, compiler::to_string(global_parameter_types[i]),
                     parameter_shardings[i].to_string());
  for (size_t i = 0; i < output_shardings.size(); ++i)
    t += fmt::format("//   output {}: {} {}\n", i, compiler::to_string(global_output_types[i]),
                     output_shardings[i].to_string());
  return t + local.text() + summary.text();
}

PartitionedProgram partition(const compiler::Graph& global, const Mesh& mesh,
                             const std::vector<std::optional<Sharding>>& parameter_shardings,
                             const std::vector<std::optional<Sharding>>& output_shardings,
                             const PartitionOptions& options) {
  Partitioner p(global, mesh, options);
  return p.run(parameter_shardings, output_shardings);
}

}  // namespace tessera::spmd
