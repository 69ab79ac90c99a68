// Algebraic simplification, iterated to a fixed point and followed by DCE:
//   x*1, 1*x, x+0, 0+x, x-0, x/1 -> x   (1 and 0: constants whose elements are all
//                                        equal, possibly through broadcast_to; only
//                                        when the result has x's type exactly)
//   neg(neg(x))                      -> x
//   transpose(transpose(x, p), q)    -> transpose(x, p o q), or x when that is the identity
//   reshape(reshape(x))              -> reshape(x)
//   reshape / broadcast_to / convert to x's own type, identity transpose -> x
//   adamw_update(p, convert(g, float32), ...) -> adamw_update(p, g, ...) for bfloat16 /
//                                        float16 g and float32 p: the update widens
//                                        the gradient itself (exactly, as the convert)
//   binary(broadcast_to(a), b)       -> binary(a, b) when numpy broadcasting of the
//                                        operands gives the same output shape (also
//                                        for where): the kernels read broadcast inputs
//                                        with zero strides, so no copy is needed.
// Nodes with a remat tag (remat_name) are never removed: the remat pass reads it.
// x+0 -> x also for x = -0.0 (where x+0 is +0.0): equal values, as in XLA.
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class AlgebraicSimplification : public Pass {
 public:
  std::string name() const override { return "simplify"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
