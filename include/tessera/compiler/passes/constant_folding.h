// Constant folding: a node whose inputs are all constants and whose outputs are
// small (at most kMaxFoldedElements elements each) runs at compile time through
// its own eval_cpu, and its outputs become constants. Random ops fold too: they
// are deterministic functions of a constant key. A node whose kernel throws is
// left in place so the error is reported when the program runs.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class ConstantFolding : public Pass {
 public:
  static constexpr int64_t kMaxFoldedElements = 65536;
  std::string name() const override { return "constant-folding"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
