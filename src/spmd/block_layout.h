// Internal: an array viewed as [outer, dim, inner] around one dimension — how the
// collectives move between a row-major layout split along `dim` and the communicators'
// member-major blocks (Collective::eval_cpu in collectives.cpp, the plans of
// collective_plan.cpp).
#pragma once

#include <cstdint>

#include "tessera/base/shape.h"

namespace tessera::spmd {

// Elements before, at and after `dim`.
struct Split3 {
  int64_t outer = 1, dim = 1, inner = 1;
};

inline Split3 split_at(const Shape& shape, int dim) {
  Split3 s;
  for (int i = 0; i < dim; ++i) s.outer *= shape[static_cast<size_t>(i)];
  s.dim = shape[static_cast<size_t>(dim)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}

}  // namespace tessera::spmd
