#include "tessera/compiler/passes/cse.h"

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace tessera::compiler {

namespace {

bool same_constant(const Value& a, const Value& b) {
  return a.type == b.type && std::memcmp(a.constant.raw_data(), b.constant.raw_data(), a.type.nbytes()) == 0;
}

// Merges constants with equal type and bytes into the first one (by value id).
void merge_constants(Graph& graph) {
  // Bucketed by type text and size so equal-bytes checks only run on candidates.
  std::map<std::string, std::vector<ValueId>> buckets;
  for (size_t v = 0; v < graph.values.size(); ++v) {
    Value& value = graph.values[v];
    if (value.kind != ValueKind::Constant || value.dead) continue;
    auto& bucket = buckets[to_string(value.type)];
    ValueId id = static_cast<ValueId>(v);
    bool merged = false;
    for (ValueId kept : bucket) {
      if (same_constant(graph.value(kept), value)) {
        graph.replace_uses(id, kept);
        graph.values[v].dead = true;
        merged = true;
        break;
      }
    }
    if (!merged) bucket.push_back(id);
  }
}

bool mergeable(const Node& node) { return node.remat_name.empty() && node.primitive->is_equivalent(*node.primitive); }

}  // namespace

void CommonSubexpressionElimination::run(Graph& graph) {
  merge_constants(graph);
  // Key: (region, op name, inputs); is_equivalent decides within a bucket. Inputs
  // already read the surviving values because replace_uses rewrote them as earlier
  // nodes merged.
  using Key = std::tuple<int, std::string, std::vector<ValueId>>;
  std::map<Key, std::vector<int>> seen;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    Node& node = graph.nodes[n];
    if (node.dead || !mergeable(node)) continue;
    auto& candidates = seen[Key{node.remat_region, node.primitive->name(), node.inputs}];
    int match = -1;
    for (int c : candidates) {
      const Node& first = graph.nodes[static_cast<size_t>(c)];
      if (first.outputs.size() != node.outputs.size() || !first.primitive->is_equivalent(*node.primitive)) continue;
      bool same_types = true;
      for (size_t i = 0; i < node.outputs.size(); ++i)
        same_types = same_types && graph.type(first.outputs[i]) == graph.type(node.outputs[i]);
      if (same_types) {
        match = c;
        break;
      }
    }
    if (match < 0) {
      candidates.push_back(static_cast<int>(n));
      continue;
    }
    std::vector<ValueId> kept = graph.nodes[static_cast<size_t>(match)].outputs;
    std::vector<ValueId> merged = node.outputs;
    for (size_t i = 0; i < merged.size(); ++i) graph.replace_uses(merged[i], kept[i]);
    graph.erase_node(static_cast<int>(n));
  }
  graph.compact();
}

}  // namespace tessera::compiler
