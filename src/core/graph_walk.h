// The part of a graph that depends on a set of traced arrays, in dependency order
// (what vjp walks backwards and vmap replays forwards).
#pragma once

#include <unordered_set>
#include <vector>

#include "tessera/core/array.h"

namespace tessera::detail {

struct TracedGraph {
  // One array per primitive application that depends on a traced array, inputs
  // before users. Traced arrays themselves are not in the list.
  std::vector<Array> order;
  std::unordered_set<uint64_t> dependent;  // ids of every dependent array (siblings included)
  bool depends(const Array& a) const { return dependent.count(a.id()) > 0; }
};

TracedGraph traced_graph(const std::vector<Array>& outputs, const std::vector<Array>& traced);

}  // namespace tessera::detail
