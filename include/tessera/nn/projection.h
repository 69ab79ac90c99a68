// How a module multiplies activations by one of its weights. Empty: a plain matmul (the
// compiler fuses a following bias and activation into its epilogue). The model sets it
// to an int8 (AQT) matmul for the sites its [quant] config names (models/model.cpp);
// `site` numbers the module's projections (Attention: 0 qkv, 1 output; GeluMLP: 0 fc,
// 1 proj; SwiGLU: 0 gate, 1 up, 2 down) so each gets its own rounding noise.
#pragma once

#include <functional>

#include "tessera/core/array.h"

namespace tessera::nn {

using ProjectionMatmul = std::function<Array(const Array& x, const Array& w, int site)>;

// fn(x, w, site), or matmul(x, w) when fn is empty.
Array project(const ProjectionMatmul& fn, const Array& x, const Array& w, int site);

}  // namespace tessera::nn
