#include "tessera/compiler/passes/constant_folding.h"

#include <vector>

#include "tessera/base/error.h"

namespace tessera::compiler {

namespace {

bool foldable(const Graph& graph, const Node& node) {
  for (ValueId in : node.inputs) {
    if (graph.value(in).kind != ValueKind::Constant) return false;
  }
  for (ValueId out : node.outputs) {
    if (numel(graph.type(out).shape) > ConstantFolding::kMaxFoldedElements) return false;
  }
  return !node.outputs.empty();
}

}  // namespace

void ConstantFolding::run(Graph& graph) {
  bool changed = false;
  // One forward sweep folds whole constant chains: a folded node's readers see
  // constants by the time the sweep reaches them.
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (graph.nodes[n].dead || !foldable(graph, graph.nodes[n])) continue;
    const Node& node = graph.nodes[n];
    std::vector<Array> inputs;
    for (ValueId in : node.inputs) inputs.push_back(graph.value(in).constant);
    std::vector<Array> outputs;
    for (ValueId out : node.outputs)
      outputs.push_back(Array::placeholder(graph.type(out).shape, graph.type(out).dtype));
    try {
      node.primitive->eval_cpu(inputs, outputs);
    } catch (const Error&) {
      continue;  // left for run time, which reports the error with its context
    }
    bool all_computed = true;
    for (const Array& out : outputs) all_computed = all_computed && out.is_evaluated();
    if (!all_computed) continue;
    std::vector<ValueId> old_outputs = node.outputs;
    for (size_t i = 0; i < old_outputs.size(); ++i) {
      ValueId folded = graph.add_constant(outputs[i]);
      graph.replace_uses(old_outputs[i], folded);
    }
    graph.erase_node(static_cast<int>(n));
    changed = true;
  }
  if (changed) graph.compact();
}

}  // namespace tessera::compiler
