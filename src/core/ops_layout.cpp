// Layout ops: reshape, transpose, broadcast, slice, concatenate and friends.
#include <algorithm>
#include <numeric>

#include "tessera/core/ops.h"
#include "tessera/ir/primitives/layout.h"

namespace tessera {

Array reshape(const Array& a, Shape shape) {
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) fail<ShapeError>("reshape: more than one -1 in target shape {}", to_string(shape));
      infer = i;
    } else if (shape[i] < 0) {
      fail<ShapeError>("reshape: negative dimension {} in target shape {}", shape[i], to_string(shape));
    } else {
      known = known * shape[i];
    }
  }
  const int64_t n = a.size();
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      fail<ShapeError>("reshape: cannot reshape array of shape {} ({} elements) into {}", to_string(a.shape()), n,
                       to_string(shape));
    shape[infer] = n / known;
  }
  if (numel(shape, "reshape") != n)
    fail<ShapeError>("reshape: cannot reshape array of shape {} ({} elements) into {} ({} elements)",
                     to_string(a.shape()), n, to_string(shape), numel(shape));
  if (shape == a.shape()) return a;
  return Array::make(shape, a.dtype(), std::make_shared<Reshape>(shape), {a});
}

Array transpose(const Array& a, std::vector<int> perm) {
  const int n = a.ndim();
  if (perm.empty()) {
    perm.resize(n);
    std::iota(perm.rbegin(), perm.rend(), 0);
  }
  if (static_cast<int>(perm.size()) != n)
    fail<AxisError>("transpose: permutation of length {} for an array of rank {} (shape {})", perm.size(), n,
                    to_string(a.shape()));
  std::vector<bool> seen(n, false);
  for (int& p : perm) {
    p = normalize_axis(p, n, "transpose");
    if (seen[p]) fail<AxisError>("transpose: axis {} repeated in the permutation", p);
    seen[p] = true;
  }
  bool identity = true;
  for (int i = 0; i < n; ++i) identity = identity && perm[i] == i;
  if (identity) return a;
  Shape shape(n);
  for (int i = 0; i < n; ++i) shape[i] = a.shape()[perm[i]];
  return Array::make(shape, a.dtype(), std::make_shared<Transpose>(perm), {a});
}

Array swapaxes(const Array& a, int axis1, int axis2) {
  std::vector<int> perm(a.ndim());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[normalize_axis(axis1, a.ndim(), "swapaxes")], perm[normalize_axis(axis2, a.ndim(), "swapaxes")]);
  return transpose(a, perm);
}

Array moveaxis(const Array& a, int source, int destination) {
  int src = normalize_axis(source, a.ndim(), "moveaxis");
  int dst = normalize_axis(destination, a.ndim(), "moveaxis");
  std::vector<int> perm;
  for (int i = 0; i < a.ndim(); ++i)
    if (i != src) perm.push_back(i);
  perm.insert(perm.begin() + dst, src);
  return transpose(a, perm);
}

Array expand_dims(const Array& a, int axis) {
  int ax = normalize_axis(axis, a.ndim() + 1, "expand_dims");
  Shape shape = a.shape();
  shape.insert(shape.begin() + ax, 1);
  return reshape(a, shape);
}

Array squeeze(const Array& a, std::vector<int> axes) {
  Shape shape;
  if (axes.empty()) {
    for (int64_t d : a.shape())
      if (d != 1) shape.push_back(d);
    return reshape(a, shape);
  }
  std::vector<int> norm = normalize_axes(axes, a.ndim(), "squeeze");
  for (int i = 0; i < a.ndim(); ++i) {
    if (std::find(norm.begin(), norm.end(), i) != norm.end()) {
      if (a.shape()[i] != 1)
        fail<ShapeError>("squeeze: axis {} of shape {} has size {} (expected 1)", i, to_string(a.shape()),
                         a.shape()[i]);
      continue;
    }
    shape.push_back(a.shape()[i]);
  }
  return reshape(a, shape);
}

Array broadcast_to(const Array& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  bool ok = a.ndim() <= static_cast<int>(shape.size());
  for (int i = 0; ok && i < a.ndim(); ++i) {
    int64_t d = a.shape()[a.ndim() - 1 - i];
    int64_t t = shape[shape.size() - 1 - i];
    ok = d == t || d == 1;
  }
  if (!ok)
    fail<ShapeError>("broadcast_to: cannot broadcast shape {} to {} (each dim must match or be 1)",
                     to_string(a.shape()), to_string(shape));
  numel(shape, "broadcast_to");
  return Array::make(shape, a.dtype(), std::make_shared<BroadcastTo>(shape), {a});
}

Array slice(const Array& a, std::vector<int64_t> start, std::vector<int64_t> stop, std::vector<int64_t> step) {
  const int n = a.ndim();
  if (step.empty()) step.assign(n, 1);
  if (static_cast<int>(start.size()) != n || static_cast<int>(stop.size()) != n || static_cast<int>(step.size()) != n)
    fail<ShapeError>("slice: start/stop/step must have one entry per axis of shape {} (got {}, {}, {})",
                     to_string(a.shape()), start.size(), stop.size(), step.size());
  Shape shape(n);
  bool full = true;
  for (int i = 0; i < n; ++i) {
    int64_t dim = a.shape()[i];
    if (step[i] < 1) fail<ValueError>("slice: step {} on axis {} (expected >= 1)", step[i], i);
    // Python semantics: negative indices count from the end; clamp to [0, dim].
    auto clampi = [dim](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + dim : v, 0, dim); };
    start[i] = clampi(start[i]);
    stop[i] = std::max(start[i], clampi(stop[i]));
    shape[i] = (stop[i] - start[i] + step[i] - 1) / step[i];
    full = full && start[i] == 0 && stop[i] == dim && step[i] == 1;
  }
  if (full) return a;
  return Array::make(shape, a.dtype(), std::make_shared<Slice>(start, stop, step), {a});
}

Array slice_axis(const Array& a, int axis, int64_t start, int64_t stop, int64_t step) {
  int ax = normalize_axis(axis, a.ndim(), "slice_axis");
  std::vector<int64_t> starts(a.ndim(), 0), stops(a.shape().begin(), a.shape().end()), steps(a.ndim(), 1);
  starts[ax] = start;
  stops[ax] = stop;
  steps[ax] = step;
  return slice(a, starts, stops, steps);
}

Array concatenate(const std::vector<Array>& arrays, int axis) {
  if (arrays.empty()) fail<ValueError>("concatenate: needs at least one array");
  const Array& first = arrays[0];
  int ax = normalize_axis(axis, first.ndim(), "concatenate");
  Shape shape = first.shape();
  shape[ax] = 0;
  DType dtype = first.dtype();
  for (const Array& a : arrays) dtype = promote_types(dtype, a.dtype());
  std::vector<Array> inputs;
  for (size_t k = 0; k < arrays.size(); ++k) {
    const Array& a = arrays[k];
    bool ok = a.ndim() == first.ndim();
    for (int i = 0; ok && i < a.ndim(); ++i) ok = i == ax || a.shape()[i] == first.shape()[i];
    if (!ok)
      fail<ShapeError>(
          "concatenate: array {} has shape {}, incompatible with {} along axis {} (all dims but the "
          "concatenation axis must match)",
          k, to_string(a.shape()), to_string(first.shape()), ax);
    shape[ax] += a.shape()[ax];
    inputs.push_back(astype(a, dtype));
  }
  if (inputs.size() == 1) return inputs[0];
  return Array::make(shape, dtype, std::make_shared<Concatenate>(ax), inputs);
}

Array stack(const std::vector<Array>& arrays, int axis) {
  if (arrays.empty()) fail<ValueError>("stack: needs at least one array");
  int ax = normalize_axis(axis, arrays[0].ndim() + 1, "stack");
  std::vector<Array> expanded;
  for (const Array& a : arrays) {
    if (a.shape() != arrays[0].shape())
      fail<ShapeError>("stack: shapes {} and {} differ (all arrays must have the same shape)", to_string(a.shape()),
                       to_string(arrays[0].shape()));
    expanded.push_back(expand_dims(a, ax));
  }
  return concatenate(expanded, ax);
}

Array flatten(const Array& a) { return reshape(a, {a.size()}); }

}  // namespace tessera
