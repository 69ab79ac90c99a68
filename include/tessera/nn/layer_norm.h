// LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * scale (+ bias).
#pragma once

#include <cstdint>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"

namespace tessera::nn {

struct LayerNorm {
  int64_t dim = 0;
  double eps = 1e-5;
  bool bias = true;

  // {"scale": ones [dim], "bias": zeros [dim]} (axes "norm", kind Norm).
  Tree init(ParamScope scope) const;
  Array operator()(const Tree& p, const Array& x) const;
};

}  // namespace tessera::nn
