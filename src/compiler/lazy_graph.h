// The lazy Array graph behind some arrays -> a compiler Graph. Shared by eval()
// (evaluated arrays the graph reads become parameters, bound per run) and jit
// tracing (the function's placeholders are the parameters; evaluated arrays it
// captured become constants).
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "tessera/compiler/graph.h"
#include "tessera/core/array.h"

namespace tessera::compiler {

struct OutputKey {
  const detail::OpNode* op;
  int index;
  bool operator==(const OutputKey& o) const { return op == o.op && index == o.index; }
};
struct OutputKeyHash {
  size_t operator()(const OutputKey& k) const {
    return std::hash<const void*>()(k.op) * 31 + static_cast<size_t>(k.index);
  }
};

struct LazyGraph {
  Graph graph;
  std::vector<detail::OpNode*> ops;  // unevaluated ops, inputs before users
  std::unordered_map<OutputKey, ValueId, OutputKeyHash> produced;
  std::vector<Array> captured;  // evaluated arrays read (parameters in eval mode, constants in jit mode)
  // The value of an array the graph reads or computes.
  ValueId value_of(const Array& a) const;
  std::unordered_map<const detail::ArrayImpl*, ValueId> leaf_ids;
};

enum class CapturedArrays { AsParameters, AsConstants };

// `parameters`: leaves (jit placeholders) that become the graph's parameters in
// order. `on_unknown_leaf(root, leaf)` is called for a leaf without data that is not
// a parameter (it must throw).
LazyGraph build_lazy_graph(const std::vector<Array>& roots, const std::vector<Array>& parameters,
                           CapturedArrays captured,
                           const std::function<void(const Array& root, const Array& leaf)>& on_unknown_leaf);

}  // namespace tessera::compiler
