// GEMM epilogue fusion: matmul -> add(bias) -> activation chains become one
// MatmulEpilogue node (ir/primitives/matmul_epilogue.h), whose kernel applies the bias
// and activation to each output tile of the GEMM while it is in cache, instead of two
// more passes over the output in memory. Runs before the elementwise fusion pass.
//
// The pattern, for a Matmul whose output value is v:
//  * bias: v's only reader is an add(v, bias) or add(bias, v) (v not returned), where
//    bias is a row vector of the output's last dim ([N] or [1, ..., 1, N], same dtype),
//    or a broadcast_to of one (read through). Then v becomes the add's output.
//  * activation: the first reader of v that is gelu_tanh, gelu_erf, relu, silu, tanh or
//    sigmoid. When v has other readers (or is returned) the fused node also returns v
//    as its pre-activation output (the gelu vjp reads it).
//  * activation gradient (first, for a plain matmul): v's only reader is
//    gelu_tanh_grad(x, v) (v not returned): an MLP's backward, the gradient of the
//    activation's input x from the product, the gradient of its output. The fused node
//    (activation_grad=gelu_tanh, inputs a, b, x) takes the gradient's place, since x may
//    be made after the matmul; on the GPU it is cuBLASLt's DGELU epilogue.
// A match needs a bias, an activation or an activation gradient. Nodes in different
// checkpoint regions, or named with checkpoint_name, are not fused. The fused node takes
// the place of the add (or of the matmul when there is no bias).
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class GemmEpiloguePass : public Pass {
 public:
  std::string name() const override { return "gemm-epilogue"; }
  void run(Graph& graph) override;
};

}  // namespace tessera::compiler
