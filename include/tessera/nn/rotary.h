// Rotary position embeddings (RoPE), rotate-half form as in Llama / Hugging Face:
//   inv_freq[i] = theta^(-2i / D),  angle(p, j) = p * inv_freq[j mod D/2]
//   rope(x)[..., j] = x[j] cos(angle) + rotate_half(x)[j] sin(angle),
//   rotate_half(x) = concat(-x[D/2:], x[:D/2]).
// No parameters: the cos/sin tables are computed on the host in float64.
#pragma once

#include <cstdint>
#include <utility>

#include "tessera/core/array.h"

namespace tessera::nn {

struct Rotary {
  int64_t head_dim = 0;  // even
  double theta = 10000.0;

  // x [..., T, head_dim] at positions offset .. offset + T - 1.
  Array operator()(const Array& x, int64_t offset = 0) const;
  // cos and sin tables [T, head_dim] for those positions, of `dtype`.
  std::pair<Array, Array> tables(int64_t length, int64_t offset, DType dtype) const;
};

}  // namespace tessera::nn
