// Partial evaluation: a graph split at some of its parameters (partial_eval.h).
#include "tessera/compiler/partial_eval.h"

#include <map>

#include "tessera/base/error.h"

namespace tessera::compiler {
namespace {

// Copies nodes of `from` into `to`, reading their inputs through `mapped` (old value id ->
// new); a constant read for the first time is added to `to`.
class Copier {
 public:
  Copier(const Graph& from, Graph& to) : from_(from), to_(to) { to_.remat_regions = from.remat_regions; }

  void bind(ValueId old_value, ValueId new_value) { mapped_[old_value] = new_value; }
  // old_value reads as `source` does, looked up when it is first read (source may be
  // copied later).
  void alias(ValueId old_value, ValueId source) { aliases_[old_value] = source; }

  ValueId value(ValueId old_value) {
    if (auto it = mapped_.find(old_value); it != mapped_.end()) return it->second;
    if (auto it = aliases_.find(old_value); it != aliases_.end()) return mapped_[old_value] = value(it->second);
    const Value& v = from_.value(old_value);
    if (v.kind != ValueKind::Constant)
      fail<Error>("partial_eval: value %{} ({}) is read before it is defined", old_value, to_string(v.type));
    const ValueId added = to_.add_constant(v.constant);
    mapped_[old_value] = added;
    return added;
  }

  void node(const Node& n) {
    std::vector<ValueId> inputs;
    for (ValueId in : n.inputs) inputs.push_back(value(in));
    std::vector<TensorType> types;
    for (ValueId out : n.outputs) types.push_back(from_.type(out));
    const std::vector<ValueId> outputs = to_.add_node(n.primitive, std::move(inputs), std::move(types));
    to_.nodes.back().remat_region = n.remat_region;
    to_.nodes.back().remat_name = n.remat_name;
    for (size_t i = 0; i < outputs.size(); ++i) mapped_[n.outputs[i]] = outputs[i];
  }

 private:
  const Graph& from_;
  Graph& to_;
  std::map<ValueId, ValueId> mapped_, aliases_;
};

}  // namespace

SplitGraph partial_eval(const Graph& graph, const std::vector<bool>& unknown, const std::vector<size_t>& known_outputs,
                        const std::vector<size_t>& unknown_outputs, const std::vector<bool>& recomputed_from) {
  if (unknown.size() != graph.parameters.size())
    fail<ValueError>("partial_eval: {} flags for the {} parameters of '{}'", unknown.size(), graph.parameters.size(),
                     graph.name);
  if (!recomputed_from.empty() && recomputed_from.size() != graph.parameters.size())
    fail<ValueError>("partial_eval: {} recompute flags for the {} parameters of '{}'", recomputed_from.size(),
                     graph.parameters.size(), graph.name);
  for (size_t p = 0; p < recomputed_from.size(); ++p)
    if (recomputed_from[p] && unknown[p])
      fail<ValueError>("partial_eval: parameter {} of '{}' is unknown, so the unknown part cannot recompute from it", p,
                       graph.name);
  for (const std::vector<size_t>* list : {&known_outputs, &unknown_outputs})
    for (size_t i : *list)
      if (i >= graph.outputs.size())
        fail<ValueError>("partial_eval: output {} of '{}', which has {}", i, graph.name, graph.outputs.size());

  // Which values depend on an unknown parameter.
  std::vector<bool> is_unknown(graph.values.size(), false);
  for (size_t p = 0; p < unknown.size(); ++p)
    if (unknown[p]) is_unknown[static_cast<size_t>(graph.parameters[p])] = true;
  std::vector<bool> node_unknown(graph.nodes.size(), false);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    if (node.dead) continue;
    bool u = false;
    for (ValueId in : node.inputs) u = u || is_unknown[static_cast<size_t>(in)];
    node_unknown[n] = u;
    for (ValueId out : node.outputs) is_unknown[static_cast<size_t>(out)] = u;
  }
  // The known values that are functions of the recomputed_from parameters alone, and the
  // node defining each node output.
  std::vector<bool> recomputable(graph.values.size(), false);
  std::vector<size_t> producer(graph.values.size(), graph.nodes.size());
  for (size_t p = 0; p < recomputed_from.size(); ++p)
    if (recomputed_from[p]) recomputable[static_cast<size_t>(graph.parameters[p])] = true;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    if (node.dead) continue;
    bool r = !recomputed_from.empty() && !node_unknown[n] && !node.inputs.empty();
    for (ValueId in : node.inputs)
      r = r && (recomputable[static_cast<size_t>(in)] || graph.value(in).kind == ValueKind::Constant);
    for (ValueId out : node.outputs) {
      recomputable[static_cast<size_t>(out)] = r;
      producer[static_cast<size_t>(out)] = n;
    }
  }
  for (size_t i : known_outputs)
    if (is_unknown[static_cast<size_t>(graph.outputs[i])])
      fail<ValueError>("partial_eval: output {} of '{}' depends on an unknown parameter; it cannot be known", i,
                       graph.name);

  // What the unknown part reads of the known values: node outputs become residuals,
  // parameters are passed again, constants are copied. A value that is an identity of
  // another (the primal wrappers autodiff traces) counts as its source: an identity of a
  // parameter is the parameter, not a residual copy of it.
  std::vector<ValueId> source(graph.values.size());
  for (size_t v = 0; v < source.size(); ++v) source[v] = static_cast<ValueId>(v);
  for (const Node& node : graph.nodes)
    if (!node.dead && node.primitive->name() == "identity" && node.inputs.size() == 1 && node.outputs.size() == 1)
      source[static_cast<size_t>(node.outputs[0])] = source[static_cast<size_t>(node.inputs[0])];
  std::vector<ValueId> residuals, read;  // read: the known values the unknown part reads
  std::vector<bool> is_residual(graph.values.size(), false), is_read(graph.values.size(), false);
  std::vector<bool> forwarded(graph.parameters.size(), false);
  std::vector<bool> recomputed(graph.nodes.size(), false);  // known nodes the unknown part copies
  std::map<ValueId, size_t> parameter_index;
  for (size_t p = 0; p < graph.parameters.size(); ++p) parameter_index[graph.parameters[p]] = p;
  std::vector<ValueId> pending;  // values read by recomputed nodes, not yet visited
  auto read_by_unknown = [&](ValueId v) {
    if (is_unknown[static_cast<size_t>(v)] || is_read[static_cast<size_t>(v)]) return;
    is_read[static_cast<size_t>(v)] = true;
    read.push_back(v);
    const ValueId s = source[static_cast<size_t>(v)];
    const Value& value = graph.value(s);
    if (value.kind == ValueKind::Parameter) {
      forwarded[parameter_index.at(s)] = true;
    } else if (value.kind == ValueKind::NodeOutput && recomputable[static_cast<size_t>(s)]) {
      const size_t n = producer[static_cast<size_t>(s)];
      if (!recomputed[n]) {
        recomputed[n] = true;
        pending.insert(pending.end(), graph.nodes[n].inputs.begin(), graph.nodes[n].inputs.end());
      }
    } else if (value.kind == ValueKind::NodeOutput && !is_residual[static_cast<size_t>(s)]) {
      is_residual[static_cast<size_t>(s)] = true;
      residuals.push_back(s);
    }
  };
  auto read_with_inputs = [&](ValueId v) {
    read_by_unknown(v);
    while (!pending.empty()) {
      const ValueId next = pending.back();
      pending.pop_back();
      read_by_unknown(next);
    }
  };
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    if (!graph.nodes[n].dead && node_unknown[n])
      for (ValueId in : graph.nodes[n].inputs) read_with_inputs(in);
  for (size_t i : unknown_outputs) read_with_inputs(graph.outputs[i]);

  SplitGraph split;
  split.known.name = graph.name + "_known";
  split.unknown.name = graph.name + "_unknown";
  split.residuals = residuals.size();
  {
    Copier copy(graph, split.known);
    for (size_t p = 0; p < graph.parameters.size(); ++p)
      if (!unknown[p]) copy.bind(graph.parameters[p], split.known.add_parameter(graph.type(graph.parameters[p])));
    for (size_t n = 0; n < graph.nodes.size(); ++n)
      if (!graph.nodes[n].dead && !node_unknown[n]) copy.node(graph.nodes[n]);
    for (size_t i : known_outputs) split.known.outputs.push_back(copy.value(graph.outputs[i]));
    for (ValueId r : residuals) split.known.outputs.push_back(copy.value(r));
  }
  {
    Copier copy(graph, split.unknown);
    for (ValueId r : residuals) copy.bind(r, split.unknown.add_parameter(graph.type(r)));
    for (size_t p = 0; p < graph.parameters.size(); ++p)
      if (unknown[p] || forwarded[p]) {
        split.unknown_parameters.push_back(p);
        copy.bind(graph.parameters[p], split.unknown.add_parameter(graph.type(graph.parameters[p])));
      }
    // The known values read through an identity read its source (a recomputed one is
    // copied below, before its first reader).
    for (ValueId v : read)
      if (source[static_cast<size_t>(v)] != v) copy.alias(v, source[static_cast<size_t>(v)]);
    for (size_t n = 0; n < graph.nodes.size(); ++n)
      if (!graph.nodes[n].dead && (node_unknown[n] || recomputed[n])) copy.node(graph.nodes[n]);
    for (size_t i : unknown_outputs) split.unknown.outputs.push_back(copy.value(graph.outputs[i]));
  }
  split.known.verify();
  split.unknown.verify();
  return split;
}

}  // namespace tessera::compiler
