// Graph utilities: topological order, the readable text form, and cost totals.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/array.h"

namespace tessera {

// Unevaluated and evaluated nodes reachable from `outputs`, inputs before users.
// Each primitive application appears once (through its first-reached output).
std::vector<Array> topological_order(const std::vector<Array>& outputs);

// One line per node:  %3 = add(%1, %2) : f32[2, 3]   (leaves: "%0 = input : f32[2]").
std::string graph_text(const std::vector<Array>& outputs);

// Sum of Primitive::cost over the unevaluated part of the graph.
Cost graph_cost(const std::vector<Array>& outputs);

}  // namespace tessera
