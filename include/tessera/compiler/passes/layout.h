// Layout simplification: removes data movement that autodiff and head splitting
// leave behind, iterated to a fixed point and followed by DCE.
//
//   add(slice_pad(a), slice_pad(b), ...)  -> concatenate(a, b, ...)
//       (adds chained through single-use adds; every pad has the add's shape, unit
//        steps, and the pieces tile one axis exactly, all other axes full. The
//        vjp of a split: zeros + write + add per piece become one copy. Exact
//        because x + 0 == x; -0.0 pieces come out -0.0 instead of +0.0, as with
//        simplify's x+0 -> x.)
// Only with fold_matmul_transposes (off in the default pipeline):
//   matmul(transpose(x, swap last two), y) -> matmul(x, y) with trans_a flipped
//       (and likewise for the second operand: the GEMM reads either layout)
//   transpose(matmul(a, b), swap last two) -> matmul(b, a) with both flags flipped
//       ((op(A) op(B))^T = op(B)^T op(A)^T; only when the matmul has no other reader)
//   Off by default because OpenBLAS's kernels for the four flag combinations do not
//   round alike for every shape (sgemm NN vs TN differ bitwise at 16x32x64, and NN vs
//   NT inside the small transformer step), so jit would drift from eager, which is the
//   reference; the transposes they remove are small (the tied embedding's).
//   slice(concatenate(..., p, ...)) within one piece p -> slice(p), or p itself
//   slice(slice(x))                        -> one slice of x
//   slice(slice_pad(x)) of exactly the padded region -> x
//   full slice / full slice_pad            -> x
//   transpose that keeps the order of every axis of size > 1 -> reshape (a view)
// Nodes with a remat tag (remat_name) are never replaced: the remat pass reads them.
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class LayoutSimplification : public Pass {
 public:
  explicit LayoutSimplification(bool fold_matmul_transposes = false)
      : fold_matmul_transposes_(fold_matmul_transposes) {}
  std::string name() const override { return "layout"; }
  void run(Graph& graph) override;

 private:
  bool fold_matmul_transposes_;
};

}  // namespace tessera::compiler
