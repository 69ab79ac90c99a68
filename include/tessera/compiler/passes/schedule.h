// Memory-aware scheduling: moves every node as late as it can go, to just before
// its first user, so a value computed early but read late no longer stays live
// across the nodes in between. Nodes that produce graph outputs or have no users
// keep their relative order; the others follow the order their results are first
// needed in (ties: original order). Deterministic, and never moves a node before
// one of its inputs.
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class SchedulePass : public Pass {
 public:
  std::string name() const override { return "schedule"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
