#include "tessera/nn/rotary.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera::nn {

void Llama3RopeScaling::validate() const {
  if (!(factor > 0)) fail<ValueError>("Rotary: llama3 scaling factor = {} must be positive", factor);
  if (!(low_freq_factor > 0))
    fail<ValueError>("Rotary: llama3 scaling low_freq_factor = {} must be positive", low_freq_factor);
  if (!(high_freq_factor > low_freq_factor))
    fail<ValueError>("Rotary: llama3 scaling high_freq_factor = {} must be greater than low_freq_factor = {}",
                     high_freq_factor, low_freq_factor);
  if (original_context <= 0)
    fail<ValueError>("Rotary: llama3 scaling original_context = {} must be positive", original_context);
}

namespace {

// The llama3 band rule of rotary.h applied to one inverse frequency.
double llama3_scaled(double inv_freq, const Llama3RopeScaling& s) {
  const double context = static_cast<double>(s.original_context);
  const double wavelength = 2.0 * std::numbers::pi / inv_freq;
  if (wavelength < context / s.high_freq_factor) return inv_freq;
  if (wavelength > context / s.low_freq_factor) return inv_freq / s.factor;
  const double smooth = (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

}  // namespace

std::vector<double> Rotary::inverse_frequencies() const {
  if (head_dim <= 0 || head_dim % 2 != 0) fail<ValueError>("Rotary: head_dim {} must be positive and even", head_dim);
  if (!(theta > 0)) fail<ValueError>("Rotary: theta {} must be positive", theta);
  if (llama3) llama3->validate();
  std::vector<double> out(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    if (llama3) out[i] = llama3_scaled(out[i], *llama3);
  }
  return out;
}

std::pair<Array, Array> Rotary::tables(int64_t length, int64_t offset, DType dtype) const {
  const std::vector<double> inv_freq = inverse_frequencies();
  if (offset < 0) fail<ValueError>("Rotary: position offset {} must be >= 0", offset);
  const int64_t half = head_dim / 2;
  std::vector<double> cos_t(static_cast<size_t>(length * head_dim)), sin_t(cos_t.size());
  for (int64_t t = 0; t < length; ++t) {
    for (int64_t j = 0; j < head_dim; ++j) {
      const double angle = static_cast<double>(offset + t) * inv_freq[static_cast<size_t>(j % half)];
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

Array Rotary::operator()(const Array& x, const Array& positions) const {
  if (x.ndim() != 4 || x.shape(-1) != head_dim)
    fail<ShapeError>("Rotary: x has shape {} (expected [batch, heads, T, {}] with positions)",
                     tessera::to_string(x.shape()), head_dim);
  if (!is_integral(positions.dtype()) || positions.shape() != Shape{x.shape(0), x.shape(2)})
    fail<ShapeError>("Rotary: positions are {}{} (expected integer [batch {}, T {}])", name(positions.dtype()),
                     tessera::to_string(positions.shape()), x.shape(0), x.shape(2));
  const int last = x.ndim() - 1;
  const int64_t half = head_dim / 2;
  auto [c, s] = tables(x.shape(2), 0, x.dtype());
  // [T, D] rows gathered to [B, T, D], broadcast over the heads as [B, 1, T, D].
  c = expand_dims(take(c, positions, 0), 1);
  s = expand_dims(take(s, positions, 0), 1);
  Array rotated = concatenate({-slice_axis(x, last, half, head_dim), slice_axis(x, last, 0, half)}, last);
  return x * c + rotated * s;
}

}  // namespace tessera::nn
