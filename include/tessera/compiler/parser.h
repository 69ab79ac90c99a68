// Reads the IR text form (Graph::text) back into a Graph. Constants print their
// value inline when small ("constant {value=1}"); larger ones print
// "constant {bytes=N, hash=H}" and are supplied through `constants` in print order
// (executable deserialization does that). Errors name the line and what was expected.
#pragma once

#include <string>
#include <vector>

#include "tessera/compiler/graph.h"

namespace tessera::compiler {

Graph parse_graph(const std::string& text, const std::vector<Array>& constants = {});
// One type in the same spelling ("f32[4, 8]").
TensorType parse_type(const std::string& text);

}  // namespace tessera::compiler
