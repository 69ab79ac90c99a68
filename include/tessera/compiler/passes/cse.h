// Common subexpression elimination: a node whose primitive is equivalent to an
// earlier node's (Primitive::is_equivalent) and that reads the same inputs is
// merged into the earlier one; constants with the same type and bytes merge.
//   * A primitive that is not equivalent to itself opts out (never merged).
//   * Nodes carrying a remat tag (remat_name) are never merged, and nodes of
//     different checkpoint regions are not merged with each other: the remat pass
//     relies on its clones and the region's tagged values staying distinct.
// Deterministic: the first node in schedule order survives.
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class CommonSubexpressionElimination : public Pass {
 public:
  std::string name() const override { return "cse"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
