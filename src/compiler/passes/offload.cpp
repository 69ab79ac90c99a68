#include "tessera/compiler/passes/offload.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/layout.h"

namespace tessera::compiler {

namespace {

bool is_offload_region(const Graph& g, int region) {
  return region >= 0 && static_cast<size_t>(region) < g.remat_regions.size() &&
         g.remat_regions[static_cast<size_t>(region)].kind == CheckpointPolicy::Kind::Offload;
}

bool listed(const CheckpointPolicy& policy, const std::string& name) {
  return std::find(policy.saved_names.begin(), policy.saved_names.end(), name) != policy.saved_names.end();
}

// Whether v's buffer is a parameter's or a constant's (through views).
bool views_caller_buffer(const Graph& g, ValueId v) {
  for (size_t hops = 0; hops <= g.values.size(); ++hops) {
    const Value& value = g.value(v);
    if (value.kind != ValueKind::NodeOutput) return true;
    const Node& node = g.nodes.at(static_cast<size_t>(value.node));
    const int aliased = node.primitive->aliases_input(value.output_index);
    if (aliased < 0) return false;
    v = node.inputs.at(static_cast<size_t>(aliased));
  }
  return false;
}

// The index of the live node `count` live nodes before `index`, but not before `floor`.
int live_nodes_before(const Graph& g, int index, int count, int floor) {
  while (count > 0 && index > floor) {
    --index;
    if (!g.nodes[static_cast<size_t>(index)].dead) --count;
  }
  return std::max(index, floor);
}

// Offloads v (made in `region`); false when there is nothing to gain.
bool offload_value(Graph& g, ValueId v, int region) {
  if (views_caller_buffer(g, v)) return false;
  const std::vector<int> readers = g.users()[static_cast<size_t>(v)];
  int last_forward = g.value(v).node;
  std::vector<int> backward;
  for (int reader : readers) {
    if (g.nodes[static_cast<size_t>(reader)].remat_region == region)
      last_forward = std::max(last_forward, reader);
    else
      backward.push_back(reader);
  }
  if (backward.empty() || backward.front() <= last_forward + 1) return false;
  const TensorType type = g.type(v);
  const int offload_at = last_forward + 1;
  const ValueId host = g.insert_node(offload_at, std::make_shared<OffloadToHost>(), {v}, {type})[0];
  for (int& b : backward) ++b;
  const int load_at = live_nodes_before(g, backward.front(), HostOffload::kPrefetchNodes, offload_at + 1);
  const ValueId loaded = g.insert_node(load_at, std::make_shared<LoadFromHost>(), {host}, {type})[0];
  for (int b : backward) {
    const int reader = b >= load_at ? b + 1 : b;
    for (ValueId& in : g.nodes[static_cast<size_t>(reader)].inputs) {
      if (in == v) in = loaded;
    }
  }
  return true;
}

}  // namespace

void HostOffload::run(Graph& graph) {
  bool any = false;
  for (const CheckpointPolicy& p : graph.remat_regions) any = any || p.kind == CheckpointPolicy::Kind::Offload;
  if (!any) return;
  // The values to offload, by id: ids survive the insertions that move node indices.
  std::vector<std::pair<ValueId, int>> candidates;
  for (const Node& node : graph.nodes) {
    if (node.dead || !is_offload_region(graph, node.remat_region) ||
        !listed(graph.remat_regions[static_cast<size_t>(node.remat_region)], node.remat_name))
      continue;
    for (ValueId out : node.outputs) candidates.emplace_back(out, node.remat_region);
  }
  for (const auto& [value, region] : candidates) offload_value(graph, value, region);
}

}  // namespace tessera::compiler
