#include "tessera/compiler/passes/dce.h"

#include <vector>

namespace tessera::compiler {

void DeadCodeElimination::run(Graph& graph) {
  std::vector<char> live(graph.values.size(), 0);
  for (ValueId out : graph.outputs) live[static_cast<size_t>(out)] = 1;
  // Nodes are in execution order, so one backward sweep sees every reader of a
  // value before its producer.
  for (int n = static_cast<int>(graph.nodes.size()) - 1; n >= 0; --n) {
    Node& node = graph.nodes[static_cast<size_t>(n)];
    if (node.dead) continue;
    bool reaches_output = false;
    for (ValueId out : node.outputs) reaches_output = reaches_output || live[static_cast<size_t>(out)];
    if (!reaches_output) {
      graph.erase_node(n);
      continue;
    }
    for (ValueId in : node.inputs) live[static_cast<size_t>(in)] = 1;
  }
  // compact() also drops the constants nothing reads any more.
  graph.compact();
}

}  // namespace tessera::compiler
