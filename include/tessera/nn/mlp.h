// Transformer feed-forward blocks: GPT-2's GELU MLP (tanh gelu) and Llama's SwiGLU.
#pragma once

#include <cstdint>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"
#include "tessera/nn/projection.h"

namespace tessera::nn {

// proj(gelu_tanh(fc(x))): {"fc": {"w" [dim, hidden], "b"}, "proj": {"w" [hidden, dim], "b"}}.
struct GeluMLP {
  int64_t dim = 0, hidden = 0;
  bool bias = true;
  double init_std = 0.02;
  double out_std = 0.02;             // the residual projection (GPT-2: init_std / sqrt(2 * layers))
  ProjectionMatmul projection = {};  // the fc (site 0) and proj (site 1) products; empty: matmul

  Tree init(ParamScope scope) const;
  Array operator()(const Tree& p, const Array& x) const;
};

// down(silu(gate(x)) * up(x)), no biases: {"gate": {"w"}, "up": {"w"}, "down": {"w"}}.
struct SwiGLU {
  int64_t dim = 0, hidden = 0;
  double init_std = 0.02;
  double out_std = 0.02;
  ProjectionMatmul projection = {};  // the gate (site 0), up (1) and down (2) products; empty: matmul

  Tree init(ParamScope scope) const;
  Array operator()(const Tree& p, const Array& x) const;
};

}  // namespace tessera::nn
