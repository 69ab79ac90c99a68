// RMSNorm over the last axis (Llama): x / sqrt(mean(x^2) + eps) * scale.
#pragma once

#include <cstdint>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"

namespace tessera::nn {

struct RMSNorm {
  int64_t dim = 0;
  double eps = 1e-5;

  // {"scale": ones [dim]} (axes "norm", kind Norm).
  Tree init(ParamScope scope) const;
  Array operator()(const Tree& p, const Array& x) const;
};

}  // namespace tessera::nn
