// ClassifierFusionPass (see the header): the match, the dependency check and the
// rewrite, then a stable topological reorder.
#include "tessera/compiler/passes/classifier_fusion.h"

#include <memory>
#include <utility>
#include <vector>

#include "compiler/passes/topological_order.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera::compiler {
namespace {

struct Match {
  int forward = -1, grad = -1;  // the cross_entropy and cross_entropy_grad nodes
};

// True when value v is computed (transitively) from an output of node `from`.
bool depends_on(const Graph& g, ValueId v, int from) {
  std::vector<bool> seen(g.nodes.size(), false);
  std::vector<ValueId> stack{v};
  while (!stack.empty()) {
    const Value& value = g.value(stack.back());
    stack.pop_back();
    if (value.kind != ValueKind::NodeOutput || value.node < 0) continue;
    if (value.node == from) return true;
    if (seen[static_cast<size_t>(value.node)]) continue;
    seen[static_cast<size_t>(value.node)] = true;
    for (ValueId in : g.nodes[static_cast<size_t>(value.node)].inputs) stack.push_back(in);
  }
  return false;
}

std::vector<Match> find_matches(const Graph& g) {
  std::vector<Match> matches;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& grad = g.nodes[n];
    const auto* ceg = dynamic_cast<const CrossEntropyGrad*>(grad.primitive.get());
    if (grad.dead || ceg == nullptr || !grad.remat_name.empty() || grad.inputs.size() != 4) continue;
    const Value& lse = g.value(grad.inputs[2]);
    if (lse.kind != ValueKind::NodeOutput || lse.node < 0) continue;
    const Node& fwd = g.nodes[static_cast<size_t>(lse.node)];
    const auto* ce = dynamic_cast<const CrossEntropy*>(fwd.primitive.get());
    if (fwd.dead || ce == nullptr || !fwd.remat_name.empty() || fwd.remat_region != grad.remat_region ||
        fwd.outputs.size() != 2 || fwd.outputs[1] != grad.inputs[2] || fwd.inputs.size() != 2 ||
        fwd.inputs[0] != grad.inputs[0] || fwd.inputs[1] != grad.inputs[1] ||
        ce->ignore_index() != ceg->ignore_index() || ce->classes() != ceg->classes())
      continue;
    if (depends_on(g, grad.inputs[3], lse.node)) continue;
    matches.push_back({lse.node, static_cast<int>(n)});
  }
  return matches;
}

}  // namespace

void ClassifierFusionPass::run(Graph& graph) {
  const std::vector<Match> matches = find_matches(graph);
  if (matches.empty()) return;
  for (const Match& m : matches) {
    // Node indices stay valid: add_node appends, erase_node only marks.
    const Node fwd = graph.nodes[static_cast<size_t>(m.forward)];
    const Node grad = graph.nodes[static_cast<size_t>(m.grad)];
    const auto& ce = static_cast<const CrossEntropy&>(*fwd.primitive);
    std::vector<TensorType> types = {graph.type(fwd.outputs[0]), graph.type(fwd.outputs[1]),
                                     graph.type(grad.outputs[0])};
    const std::vector<ValueId> outs =
        graph.add_node(std::make_shared<CrossEntropyWithGrad>(ce.ignore_index(), ce.classes()),
                       {grad.inputs[0], grad.inputs[1], grad.inputs[3]}, types);
    graph.nodes.back().remat_region = grad.remat_region;
    graph.replace_uses(fwd.outputs[0], outs[0]);
    graph.replace_uses(fwd.outputs[1], outs[1]);
    graph.replace_uses(grad.outputs[0], outs[2]);
    graph.erase_node(m.grad);
    graph.erase_node(m.forward);
  }
  topological_reorder(graph);
  graph.compact();
}

}  // namespace tessera::compiler
