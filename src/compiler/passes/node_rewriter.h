// The machinery the peephole passes (simplify, layout) share: a sweep over the live
// nodes in schedule order calling rewrite(n) until a sweep changes nothing, and the
// helpers a rewrite needs.
#pragma once

#include "tessera/compiler/graph.h"

namespace tessera::compiler {

class NodeRewriter {
 public:
  explicit NodeRewriter(Graph& graph) : g_(graph) {}
  virtual ~NodeRewriter() = default;

  // Sweeps until nothing changes; true when anything did.
  bool run_to_fixed_point() {
    bool any = false;
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t n = 0; n < g_.nodes.size(); ++n) {
        if (!g_.nodes[n].dead) changed = rewrite(static_cast<int>(n)) || changed;
      }
      any = any || changed;
    }
    return any;
  }

 protected:
  // Rewrites node n if a rule applies; true when it changed the graph.
  virtual bool rewrite(int n) = 0;

  Node& node(int n) { return g_.nodes[static_cast<size_t>(n)]; }

  // The live node producing v as a P (nullptr otherwise). With `untagged`, producers
  // carrying a remat tag are refused: the remat pass reads their tags.
  template <typename P>
  const P* producer_as(ValueId v, bool untagged = true) const {
    const Node* nd = g_.producer(v);
    if (nd == nullptr || nd->dead || (untagged && !nd->remat_name.empty())) return nullptr;
    return dynamic_cast<const P*>(nd->primitive.get());
  }

  // Replaces node n's single output by x and erases n. Tagged nodes stay.
  bool forward(int n, ValueId x) {
    Node& nd = node(n);
    if (!nd.remat_name.empty() || nd.outputs.size() != 1 || g_.type(nd.outputs[0]) != g_.type(x)) return false;
    g_.replace_uses(nd.outputs[0], x);
    g_.erase_node(n);
    return true;
  }

  Graph& g_;
};

}  // namespace tessera::compiler
