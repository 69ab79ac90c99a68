// Fusion: greedy producer-consumer fusion of elementwise chains into Fusion nodes
// (ir/primitives/fusion.h), which run as one tiled kernel instead of one pass over
// memory per op.
//
//  * Elementwise groups: Unary / Binary / Where / Cast nodes with one output shape,
//    joined along producer -> consumer edges in schedule order. A broadcast_to feeding
//    a member is read through (its input becomes a broadcast input of the fusion);
//    parameters and constants are plain inputs. A member value used outside the group
//    (or returned) becomes an extra output. A merge that would make the group both feed
//    and consume an outside node (a cycle) is refused, and so is a merge across
//    checkpoint regions or of a node named with checkpoint_name. Groups of one op stay
//    as they are. The Fusion node takes the place of the group's last member.
//  * Fused reductions: a Reduce (sum or max over trailing axes) whose input is the only
//    value its elementwise group (one op or more) gives to the rest of the graph is
//    folded in: the Fusion reduces the group's result tile by tile.
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class FusionPass : public Pass {
 public:
  struct Options {
    bool elementwise = true;
    bool reductions = true;
  };
  FusionPass() = default;
  explicit FusionPass(Options options) : options_(options) {}
  std::string name() const override { return "fusion"; }
  void run(Graph& graph) override;

 private:
  Options options_;
};

}  // namespace tessera::compiler
