// For passes that append replacement nodes at the end of the graph (classifier fusion,
// attention layout): puts each node right after everything it reads, keeping the
// current order otherwise (SchedulePass orders the kernels later).
#pragma once

#include "tessera/compiler/graph.h"

namespace tessera::compiler {

void topological_reorder(Graph& g);

}  // namespace tessera::compiler
