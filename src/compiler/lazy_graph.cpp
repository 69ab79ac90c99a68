#include "compiler/lazy_graph.h"

#include <unordered_set>

#include "tessera/core/runtime_hooks.h"

namespace tessera::compiler {

using detail::ArrayImpl;
using detail::OpNode;

ValueId LazyGraph::value_of(const Array& a) const {
  auto it = leaf_ids.find(a.impl());
  if (it != leaf_ids.end()) return it->second;
  return produced.at({a.impl()->op.get(), a.impl()->output_index});
}

LazyGraph build_lazy_graph(const std::vector<Array>& roots, const std::vector<Array>& parameters,
                           CapturedArrays captured,
                           const std::function<void(const Array& root, const Array& leaf)>& on_unknown_leaf) {
  LazyGraph lg;
  Graph& graph = lg.graph;
  for (const Array& p : parameters) lg.leaf_ids[p.impl()] = graph.add_parameter({p.shape(), p.dtype()});
  // Iterative DFS over raw pointers: eval counts the references others hold to
  // intermediates, so this must not keep any.
  std::unordered_set<const OpNode*> visited;
  struct Frame {
    OpNode* op;
    size_t next;
  };
  auto visit_leaf = [&](const Array& root, const Array& a) {
    ArrayImpl* impl = a.impl();
    if (lg.leaf_ids.count(impl)) return;
    // A sharded array read eagerly, or a GPU program's output: its value comes to the host.
    detail::read_to_host(a);
    if (!impl->storage) {
      on_unknown_leaf(root, a);
      return;
    }
    lg.leaf_ids[impl] =
        captured == CapturedArrays::AsParameters ? graph.add_parameter({a.shape(), a.dtype()}) : graph.add_constant(a);
    lg.captured.push_back(a);
  };
  for (const Array& root : roots) {
    ArrayImpl* r = root.impl();
    if (lg.leaf_ids.count(r)) continue;
    if (r->storage || !r->op) {
      visit_leaf(root, root);
      continue;
    }
    std::vector<Frame> stack;
    if (visited.insert(r->op.get()).second) stack.push_back({r->op.get(), 0});
    while (!stack.empty()) {
      Frame& top = stack.back();
      if (top.next < top.op->inputs.size()) {
        const Array& in = top.op->inputs[top.next++];
        ArrayImpl* impl = in.impl();
        if (lg.leaf_ids.count(impl)) continue;
        if (impl->storage || !impl->op) {
          visit_leaf(root, in);
        } else if (visited.insert(impl->op.get()).second) {
          stack.push_back({impl->op.get(), 0});
        }
        continue;
      }
      lg.ops.push_back(top.op);
      stack.pop_back();
    }
  }

  std::unordered_map<int, int> regions;  // global checkpoint region -> graph region
  for (OpNode* op : lg.ops) {
    std::vector<ValueId> inputs;
    for (const Array& in : op->inputs) inputs.push_back(lg.value_of(in));
    std::vector<TensorType> types;
    for (size_t i = 0; i < op->output_shapes.size(); ++i) types.push_back({op->output_shapes[i], op->output_dtypes[i]});
    std::vector<ValueId> outs = graph.add_node(op->primitive, std::move(inputs), std::move(types));
    Node& node = graph.nodes.back();
    if (op->remat_region >= 0) {
      auto [it, inserted] = regions.emplace(op->remat_region, static_cast<int>(graph.remat_regions.size()));
      if (inserted) graph.remat_regions.push_back(detail::checkpoint_policy(op->remat_region));
      node.remat_region = it->second;
    }
    node.remat_name = op->remat_name;
    for (size_t i = 0; i < outs.size(); ++i) lg.produced[{op, static_cast<int>(i)}] = outs[i];
  }
  return lg;
}

}  // namespace tessera::compiler
