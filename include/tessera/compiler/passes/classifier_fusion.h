// Classifier fusion (llm.c's fused classifier): a cross_entropy and the
// cross_entropy_grad that reads its lse become one cross_entropy_with_grad node
// (ir/primitives/nn.h), whose kernel computes the loss and writes the logits' gradient
// in one pass over the logits, while each row is in cache, instead of reading the
// logits (the largest activation of a language model: 1.6 GB for GPT-2 at 16 x 1024
// tokens) once for the loss and again in the backward. Its gradient may also take the
// logits' buffer.
//
// The pattern: a cross_entropy_grad G(logits, targets, lse, dloss) whose lse is output 1
// of a cross_entropy F(logits, targets) with the same ignore_index and classes, where
// dloss does not depend on F (a mean loss's dloss is 1 / count, from the targets; a
// loss squared would feed the loss back and is left alone). Nodes named with
// checkpoint_name or in different checkpoint regions are not fused. The fused node's
// users are then put in a topological order that keeps the rest of the order
// (SchedulePass runs later).
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class ClassifierFusionPass : public Pass {
 public:
  std::string name() const override { return "classifier-fusion"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
