// MatmulEpilogue: a GEMM whose elementwise epilogue runs on each output tile while
// the tile is in cache (built by the compiler's gemm-epilogue pass, after autodiff):
//
//   s = matmul(a, b)  (+ bias)        bias: the output's last dim, shape [N] or [1, ..., 1, N]
//   y = activation(s)                 when an activation is set, else y = s
//   outputs: y, and s as a second output when pre_activation is set (the gelu vjp reads it)
// or, with activation_grad (the backward's form; no bias, activation or pre_activation):
//   y = activation_grad(x, s)         e.g. gelu_tanh_grad(x, s) = s * gelu_tanh'(x): the
//                                     gradient of the activation's input x (the forward's
//                                     pre-activation) from the GEMM s, the gradient of its output
//
// Inputs are (a, b), (a, b, bias) or, with activation_grad, (a, b, x); a and b as for
// Matmul (same transposes, 2-D or batched), x of the output's shape and dtype. Each
// element is computed on the CPU with the per-element code of the unfused matmul, add
// and activation (or gradient) kernels, so results are bitwise those of the unfused graph.
//
// IR text: %5, %6 = matmul_epilogue(%0, %1, %2) {activation=gelu_tanh, pre_activation=true} : ...
//   attributes (defaults omitted): trans_a, trans_b, bias=false (no bias input),
//   bias_first=true (the graph computed add(bias, x)), activation=<unary>, pre_activation,
//   activation_grad=gelu_tanh (y = gelu_tanh_grad(x, s); the only gradient supported),
//   int8=true: the GEMM is a quantized_matmul's (AQT int8, nearest rounding of both
//   operands; a [..., m, k] or a transposed [k, m], b rank 2), the epilogue applied as each
//   row is dequantized.
#pragma once

#include <optional>
#include <string>

#include "tessera/ir/primitive.h"
#include "tessera/ir/primitives/elementwise.h"

namespace tessera {

class AttributeMap;  // ir/attributes.h

class MatmulEpilogue : public Primitive {
 public:
  struct Options {
    bool trans_a = false, trans_b = false;
    bool bias = true;
    bool bias_first = false;  // add(bias, matmul) rather than add(matmul, bias)
    std::optional<UnaryKind> activation;
    bool pre_activation = false;  // also return matmul + bias (needs an activation)
    bool int8 = false;            // the GEMM is quantized_matmul's (ir/primitives/quantized.h)
    // y = <activation>_grad(x, s), x the third input (gelu_tanh only).
    std::optional<UnaryKind> activation_grad;
  };
  explicit MatmulEpilogue(Options options);
  const Options& options() const { return options_; }
  std::string name() const override { return "matmul_epilogue"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_COST

  // The activations an epilogue may apply.
  static bool supports_activation(UnaryKind kind);

 private:
  void eval_int8(const std::vector<Array>& inputs, std::vector<Array>& outputs) const;  // backend/cpu
  Options options_;
};

// Reads attributes() back (the primitive registry's factory for "matmul_epilogue").
PrimitivePtr parse_matmul_epilogue(const AttributeMap& attributes);

}  // namespace tessera
