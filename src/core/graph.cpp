#include "tessera/core/graph.h"

#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace tessera {

std::vector<Array> topological_order(const std::vector<Array>& outputs) {
  // Iterative post-order DFS; evaluated arrays are treated as inputs (not descended).
  std::vector<Array> order;
  std::unordered_set<const void*> visited;  // OpNode* for op outputs, ArrayImpl* for leaves
  auto key = [](const Array& a) -> const void* {
    return a.is_evaluated() || a.is_leaf() ? static_cast<const void*>(a.impl()) : a.impl()->op.get();
  };
  struct Frame {
    Array array;
    size_t next_input;
  };
  std::vector<Frame> stack;
  for (const Array& out : outputs) {
    if (!visited.insert(key(out)).second) continue;
    stack.push_back({out, 0});
    while (!stack.empty()) {
      Frame& top = stack.back();
      const bool expand = !top.array.is_evaluated() && !top.array.is_leaf();
      const auto& inputs = expand ? top.array.inputs() : std::vector<Array>{};
      if (top.next_input < inputs.size()) {
        const Array& in = inputs[top.next_input++];
        if (visited.insert(key(in)).second) stack.push_back({in, 0});
        continue;
      }
      order.push_back(top.array);
      stack.pop_back();
    }
  }
  return order;
}

std::string graph_text(const std::vector<Array>& outputs) {
  std::vector<Array> order = topological_order(outputs);
  std::unordered_map<const void*, int> names;
  auto name_of = [&](const Array& a) {
    auto it = names.find(a.impl());
    return it == names.end() ? std::string("%?") : "%" + std::to_string(it->second);
  };
  std::ostringstream os;
  int next = 0;
  for (const Array& node : order) {
    if (node.is_evaluated() || node.is_leaf()) {
      names[node.impl()] = next;
      os << "%" << next++ << " = input : " << type_string(node) << "\n";
      continue;
    }
    std::vector<Array> outs = node.siblings();
    std::string lhs;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i].valid()) continue;
      names[outs[i].impl()] = next;
      lhs += (lhs.empty() ? "%" : ", %") + std::to_string(next++);
    }
    os << lhs << " = " << node.primitive()->name() << "(";
    const auto& inputs = node.inputs();
    for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << name_of(inputs[i]);
    os << ")";
    std::string attrs = node.primitive()->attributes();
    if (!attrs.empty()) os << " {" << attrs << "}";
    os << " : ";
    bool first = true;
    for (const Array& o : outs) {
      if (!o.valid()) continue;
      os << (first ? "" : ", ") << type_string(o);
      first = false;
    }
    os << "\n";
  }
  return os.str();
}

Cost graph_cost(const std::vector<Array>& outputs) {
  Cost total;
  for (const Array& node : topological_order(outputs)) {
    if (node.is_evaluated() || node.is_leaf()) continue;
    std::vector<Array> outs = node.siblings();
    Cost c = node.primitive()->cost(node.inputs(), outs);
    total.flops += c.flops;
    total.bytes += c.bytes;
  }
  return total;
}

}  // namespace tessera
