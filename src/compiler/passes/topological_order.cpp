// topological_reorder (topological_order.h): a depth-first post-order from every node
// in turn.
#include "compiler/passes/topological_order.h"

#include <utility>
#include <vector>

namespace tessera::compiler {

// Each node right after everything it reads, in the current order otherwise (a
// depth-first post-order from every node in turn).
void topological_reorder(Graph& g) {
  const size_t n = g.nodes.size();
  std::vector<int> order;
  order.reserve(n);
  std::vector<char> state(n, 0);  // 0 new, 1 on the stack, 2 emitted
  std::vector<std::pair<int, size_t>> stack;
  for (size_t root = 0; root < n; ++root) {
    if (state[root] != 0) continue;
    stack.emplace_back(static_cast<int>(root), 0);
    state[root] = 1;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      const std::vector<ValueId>& inputs = g.nodes[static_cast<size_t>(node)].inputs;
      if (next < inputs.size()) {
        const Value& v = g.value(inputs[next++]);
        if (v.kind == ValueKind::NodeOutput && v.node >= 0 && state[static_cast<size_t>(v.node)] == 0) {
          state[static_cast<size_t>(v.node)] = 1;
          stack.emplace_back(v.node, 0);
        }
        continue;
      }
      state[static_cast<size_t>(node)] = 2;
      order.push_back(node);
      stack.pop_back();
    }
  }
  std::vector<Node> reordered;
  reordered.reserve(n);
  for (int i : order) reordered.push_back(std::move(g.nodes[static_cast<size_t>(i)]));
  g.nodes = std::move(reordered);
  for (size_t i = 0; i < n; ++i)
    for (ValueId out : g.nodes[i].outputs) g.values[static_cast<size_t>(out)].node = static_cast<int>(i);
}

}  // namespace tessera::compiler
