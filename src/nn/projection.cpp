#include "tessera/nn/projection.h"

#include "tessera/core/ops.h"

namespace tessera::nn {

Array project(const ProjectionMatmul& fn, const Array& x, const Array& w, int site) {
  return fn ? fn(x, w, site) : matmul(x, w);
}

}  // namespace tessera::nn
