// Rotary position embeddings (RoPE), rotate-half form as in Llama / Hugging Face:
//   inv_freq[i] = theta^(-2i / D),  angle(p, j) = p * inv_freq[j mod D/2]
//   rope(x)[..., j] = x[j] cos(angle) + rotate_half(x)[j] sin(angle),
//   rotate_half(x) = concat(-x[D/2:], x[:D/2]).
// No parameters: the cos/sin tables are computed on the host in float64.
//
// Optional Llama 3.1 scaling (Hugging Face rope_type "llama3"), which stretches the
// model's context by slowing the low frequencies only. With wavelength w = 2 pi / f of
// an inverse frequency f and the pretraining context L:
//   w < L / high_freq_factor (high frequencies):  f unchanged
//   w > L / low_freq_factor  (low frequencies):   f / factor
//   otherwise:  (1 - s) f / factor + s f,  s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
// (s runs from 0 at the low edge to 1 at the high edge, so the bands join continuously).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "tessera/core/array.h"

namespace tessera::nn {

// Llama 3.1's published values are the defaults.
struct Llama3RopeScaling {
  double factor = 8.0;              // > 0
  double low_freq_factor = 1.0;     // > 0
  double high_freq_factor = 4.0;    // > low_freq_factor
  int64_t original_context = 8192;  // L, > 0: the context the model was pretrained with

  // ValueError naming the field and its value.
  void validate() const;
};

struct Rotary {
  int64_t head_dim = 0;  // even
  double theta = 10000.0;
  std::optional<Llama3RopeScaling> llama3 = std::nullopt;  // unset: plain RoPE

  // inv_freq[i], i < head_dim / 2, in float64 (scaled when llama3 is set).
  std::vector<double> inverse_frequencies() const;
  // x [..., T, head_dim] at positions offset .. offset + T - 1.
  Array operator()(const Array& x, int64_t offset = 0) const;
  // x [B, H, T, head_dim] at per-token positions [B, T] (integer, each in [0, T): the
  // rows of the offset-0 tables are gathered, so a token at position p is rotated
  // exactly as the p-th token of an unpacked row).
  Array operator()(const Array& x, const Array& positions) const;
  // cos and sin tables [T, head_dim] for those positions, of `dtype`.
  std::pair<Array, Array> tables(int64_t length, int64_t offset, DType dtype) const;
};

}  // namespace tessera::nn
