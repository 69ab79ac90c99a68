// Inverted dropout: keeps each element with probability 1 - rate and scales the kept
// ones by 1 / (1 - rate), so inference (no key) is the identity. A key means training.
#pragma once

#include <optional>

#include "tessera/core/array.h"

namespace tessera::nn {

struct Dropout {
  double rate = 0.0;  // in [0, 1]

  Array operator()(const Array& x, const std::optional<Array>& key) const;
};

}  // namespace tessera::nn
