// Dead code elimination: drops the nodes none of whose outputs reach a graph
// output, and the constants nothing reads, then compacts the graph. The IR is
// functional (no primitive has side effects), so reachability is the whole test.
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class DeadCodeElimination : public Pass {
 public:
  std::string name() const override { return "dce"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
