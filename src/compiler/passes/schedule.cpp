// Demand-driven order: the anchored nodes (graph-output producers and nodes without
// users) are emitted in their original order, each right after a depth-first,
// post-order emission of the not-yet-emitted nodes it depends on. A non-anchored
// node is thus emitted when its first user (in the new order) needs it, i.e. as
// late as possible. Among the producers one node needs, the one heading the longest
// chain of non-anchored producers goes first (its chain then is not held across a
// short one's value, and a node made early but read late lands next to its user);
// ties keep the original order. The order depends only on the graph's structure and
// the current order of ties, so running the pass twice changes nothing.
#include "tessera/compiler/passes/schedule.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace tessera::compiler {

void SchedulePass::run(Graph& graph) {
  const size_t num_nodes = graph.nodes.size();
  std::vector<bool> has_user(num_nodes, false), anchored(num_nodes, false);
  std::vector<std::vector<int>> producers(num_nodes);  // live producers of each node's inputs
  for (size_t n = 0; n < num_nodes; ++n) {
    const Node& node = graph.nodes[n];
    if (node.dead) continue;
    for (ValueId in : node.inputs) {
      const Value& v = graph.value(in);
      if (v.kind != ValueKind::NodeOutput || v.node < 0 || graph.nodes[static_cast<size_t>(v.node)].dead) continue;
      producers[n].push_back(v.node);
      has_user[static_cast<size_t>(v.node)] = true;
    }
  }
  for (size_t n = 0; n < num_nodes; ++n) anchored[n] = !has_user[n];
  for (ValueId v : graph.outputs) {
    if (graph.value(v).kind == ValueKind::NodeOutput && graph.value(v).node >= 0) {
      anchored[static_cast<size_t>(graph.value(v).node)] = true;
    }
  }
  // Length of the longest chain of non-anchored nodes ending at each node (the
  // current order is topological, so producers are done first).
  std::vector<int> chain(num_nodes, 0);
  for (size_t n = 0; n < num_nodes; ++n) {
    for (int p : producers[n]) {
      if (!anchored[static_cast<size_t>(p)]) chain[n] = std::max(chain[n], chain[static_cast<size_t>(p)]);
    }
    chain[n] += 1;
  }
  for (auto& deps : producers) {
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    std::stable_sort(deps.begin(), deps.end(),
                     [&](int a, int b) { return chain[static_cast<size_t>(a)] > chain[static_cast<size_t>(b)]; });
  }

  std::vector<int> order;
  order.reserve(num_nodes);
  std::vector<bool> emitted(num_nodes, false);
  std::vector<std::pair<int, size_t>> stack;  // (node, next producer to visit); iterative: chains can be long
  for (size_t n = 0; n < num_nodes; ++n) {
    if (graph.nodes[n].dead || !anchored[n]) continue;
    stack.emplace_back(static_cast<int>(n), 0);
    while (!stack.empty()) {
      const int node = stack.back().first;
      const std::vector<int>& deps = producers[static_cast<size_t>(node)];
      if (stack.back().second < deps.size()) {
        const int p = deps[stack.back().second++];
        if (!emitted[static_cast<size_t>(p)]) stack.emplace_back(p, 0);
        continue;
      }
      if (!emitted[static_cast<size_t>(node)]) {
        emitted[static_cast<size_t>(node)] = true;
        order.push_back(node);
      }
      stack.pop_back();
    }
  }
  // Every live node feeds some anchored node, so only removed nodes are left; they
  // go last and keep their outputs' links.
  for (size_t n = 0; n < num_nodes; ++n) {
    if (!emitted[n]) order.push_back(static_cast<int>(n));
  }

  std::vector<Node> reordered;
  reordered.reserve(num_nodes);
  for (int n : order) reordered.push_back(std::move(graph.nodes[static_cast<size_t>(n)]));
  graph.nodes = std::move(reordered);
  for (size_t n = 0; n < num_nodes; ++n) {
    for (ValueId out : graph.nodes[n].outputs) graph.values[static_cast<size_t>(out)].node = static_cast<int>(n);
  }
}

}  // namespace tessera::compiler
