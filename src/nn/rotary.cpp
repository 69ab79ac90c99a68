#include "tessera/nn/rotary.h"

#include <cmath>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera::nn {

std::pair<Array, Array> Rotary::tables(int64_t length, int64_t offset, DType dtype) const {
  if (head_dim <= 0 || head_dim % 2 != 0) fail<ValueError>("Rotary: head_dim {} must be positive and even", head_dim);
  if (!(theta > 0)) fail<ValueError>("Rotary: theta {} must be positive", theta);
  if (offset < 0) fail<ValueError>("Rotary: position offset {} must be >= 0", offset);
  const int64_t half = head_dim / 2;
  std::vector<double> cos_t(static_cast<size_t>(length * head_dim)), sin_t(cos_t.size());
  for (int64_t t = 0; t < length; ++t) {
    for (int64_t j = 0; j < head_dim; ++j) {
      const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(j % half) / static_cast<double>(head_dim));
      const double angle = static_cast<double>(offset + t) * inv_freq;
      cos_t[static_cast<size_t>(t * head_dim + j)] = std::cos(angle);
      sin_t[static_cast<size_t>(t * head_dim + j)] = std::sin(angle);
    }
  }
  Array c = Array::from_vector(cos_t, {length, head_dim}), s = Array::from_vector(sin_t, {length, head_dim});
  if (dtype != DType::Float64) {
    c = astype(c, dtype).eval();
    s = astype(s, dtype).eval();
  }
  return {c, s};
}

Array Rotary::operator()(const Array& x, int64_t offset) const {
  if (x.ndim() < 2 || x.shape(-1) != head_dim)
    fail<ShapeError>("Rotary: x has shape {} (expected [..., T, {}])", tessera::to_string(x.shape()), head_dim);
  const int last = x.ndim() - 1;
  const int64_t half = head_dim / 2;
  auto [c, s] = tables(x.shape(-2), offset, x.dtype());
  Array rotated = concatenate({-slice_axis(x, last, half, head_dim), slice_axis(x, last, 0, half)}, last);
  return x * c + rotated * s;
}

}  // namespace tessera::nn
