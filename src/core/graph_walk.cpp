#include "core/graph_walk.h"

#include <unordered_map>

namespace tessera::detail {

TracedGraph traced_graph(const std::vector<Array>& outputs, const std::vector<Array>& traced) {
  TracedGraph g;
  for (const Array& t : traced) g.dependent.insert(t.id());
  std::unordered_set<const OpNode*> visited;
  struct Frame {
    Array array;
    size_t next_input;
  };
  std::vector<Frame> stack;
  auto push = [&](const Array& a) {
    if (g.depends(a) || !a.impl()->op) return;  // traced or a leaf
    if (!visited.insert(a.impl()->op.get()).second) return;
    stack.push_back({a, 0});
  };
  for (const Array& out : outputs) {
    push(out);
    while (!stack.empty()) {
      Frame& top = stack.back();
      const auto& inputs = top.array.inputs();
      if (top.next_input < inputs.size()) {
        push(inputs[top.next_input++]);
        continue;
      }
      bool dep = false;
      for (const Array& in : inputs) dep = dep || g.depends(in);
      if (dep) {
        for (const Array& s : top.array.siblings()) g.dependent.insert(s.id());
        g.order.push_back(top.array);
      }
      stack.pop_back();
    }
  }
  return g;
}

}  // namespace tessera::detail
