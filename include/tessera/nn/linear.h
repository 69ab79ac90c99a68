// Linear: y = x @ w (+ b), w [in, out]. Written as a plain matmul plus bias so the
// compiler fuses the bias (and a following activation) into the GEMM's epilogue.
#pragma once

#include <cstdint>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"

namespace tessera::nn {

struct Linear {
  int64_t in = 0, out = 0;
  bool bias = true;
  AxisNames axes = {"embed", "mlp"};  // of w; b takes axes[1]
  Initializer weight_init = Initializer::normal(0.02);

  // {"w": [in, out]} and, with bias, {"b": [out]} (zeros).
  Tree init(ParamScope scope) const;
  // x [..., in] -> [..., out].
  Array operator()(const Tree& p, const Array& x) const;
};

}  // namespace tessera::nn
