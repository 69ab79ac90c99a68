// Embedding: a [vocab, dim] table looked up by integer ids; attend() is the tied
// output projection (x @ table^T, GPT-2's logits).
#pragma once

#include <cstdint>

#include "tessera/core/tree.h"
#include "tessera/nn/param.h"

namespace tessera::nn {

struct Embedding {
  int64_t vocab = 0, dim = 0;
  AxisNames axes = {"vocab", "embed"};
  Initializer weight_init = Initializer::normal(0.02);

  // {"w": [vocab, dim]}.
  Tree init(ParamScope scope) const;
  // Integer ids [...] -> [..., dim].
  Array operator()(const Tree& p, const Array& ids) const;
  // x [..., dim] -> [..., vocab].
  Array attend(const Tree& p, const Array& x) const;
};

}  // namespace tessera::nn
