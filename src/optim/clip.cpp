// Global-norm gradient clipping (optim/optimizer.h). Everything is built from array
// ops, so it traces under jit: the clipping decision is a min(), not a branch.
#include <cmath>

#include "tessera/core/ops.h"
#include "tessera/optim/optimizer.h"

namespace tessera::optim {

namespace {

// The dtype the norm accumulates in: float64 when any leaf is float64, else float32
// (bfloat16/float16 squares are summed in float32).
DType norm_dtype(const std::vector<Array>& leaves) {
  for (const Array& g : leaves)
    if (g.dtype() == DType::Float64) return DType::Float64;
  return DType::Float32;
}

// The sum of squares in the accumulation dtype, so the clip scale of float64 gradients
// keeps full precision.
Array squares_wide(const Tree& grads) {
  std::vector<Array> leaves = grads.leaves();
  std::vector<std::string> paths = grads.paths();
  DType acc = norm_dtype(leaves);
  Array total = Array::scalar(0, acc);
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!is_floating(leaves[i].dtype()))
      fail<DTypeError>("global_norm: gradient \"{}\" is {} (expected a floating dtype)", paths[i],
                       type_string(leaves[i]));
    total = add(total, sum(square(astype(leaves[i], acc))));
  }
  return total;
}

// The norm in the accumulation dtype: of these gradients, or sqrt(squared_norm) when given.
Array global_norm_wide(const Tree& grads, const Array& squared_norm) {
  if (!squared_norm.valid()) return sqrt(squares_wide(grads));
  if (squared_norm.ndim() != 0 || !is_floating(squared_norm.dtype()))
    fail<ValueError>("global norm: the squared norm is {} (expected a floating scalar)", type_string(squared_norm));
  return sqrt(astype(squared_norm, norm_dtype(grads.leaves())));
}

}  // namespace

Array global_norm(const Tree& grads) { return astype(global_norm_wide(grads, Array()), DType::Float32); }

Array global_squared_norm(const Tree& grads) { return squares_wide(grads); }

std::pair<Array, Array> clip_factor(const Tree& grads, double max_norm, const Array& squared_norm) {
  if (!std::isfinite(max_norm) || max_norm <= 0)
    fail<ValueError>("clip_by_global_norm: max_norm = {} (expected a finite value > 0)", max_norm);
  Array norm = global_norm_wide(grads, squared_norm);
  // scale = min(1, max_norm / (norm + 1e-6)): 1 (no change) while the norm is under the
  // threshold; the epsilon keeps a zero gradient finite.
  Array scale = minimum(scalar_like(1, norm), divide(scalar_like(max_norm, norm), add(norm, scalar_like(1e-6, norm))));
  return {std::move(scale), astype(norm, DType::Float32)};
}

std::pair<Tree, Array> clip_by_global_norm(const Tree& grads, double max_norm, const Array& squared_norm) {
  // Not a structured binding: clang before 16 cannot capture one in a lambda.
  const std::pair<Array, Array> factor = clip_factor(grads, max_norm, squared_norm);
  const Array& scale = factor.first;
  Tree clipped = grads.map([&](const Array& g) { return multiply(g, astype(scale, g.dtype())); });
  return {std::move(clipped), factor.second};
}

}  // namespace tessera::optim
