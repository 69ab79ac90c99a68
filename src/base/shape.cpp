#include "tessera/base/shape.h"

#include <algorithm>

#include "tessera/base/error.h"

namespace tessera {

int64_t numel(const Shape& shape, std::string_view op) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail<ShapeError>("{}: negative dimension in shape {}", op, to_string(shape));
    if (d != 0 && n > INT64_MAX / d)
      fail<ShapeError>("{}: shape {} has more than 2^63-1 elements (integer overflow)", op, to_string(shape));
    n *= d;
  }
  return n;
}

std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

int normalize_axis(int64_t axis, int64_t ndim, std::string_view op) {
  if (axis < -ndim || axis >= ndim)
    fail<AxisError>("{}: axis {} is out of range for an array of rank {} (expected -{} <= axis < {})", op, axis, ndim,
                    ndim, ndim);
  return static_cast<int>(axis < 0 ? axis + ndim : axis);
}

std::vector<int> normalize_axes(const std::vector<int>& axes, int64_t ndim, std::string_view op, bool empty_means_all) {
  std::vector<int> out;
  if (axes.empty() && empty_means_all) {
    for (int i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int a : axes) out.push_back(normalize_axis(a, ndim, op));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    fail<AxisError>("{}: repeated axis in axes list (each axis may appear once)", op);
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      fail<ShapeError>("{}: shapes {} and {} cannot be broadcast together (dim {} is {} vs {}; expected equal or 1)",
                       op, to_string(a), to_string(b), i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Strides broadcast_strides(const Shape& shape, const Shape& target) {
  Strides own = contiguous_strides(shape);
  Strides out(target.size(), 0);
  size_t offset = target.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) out[offset + i] = shape[i] == 1 ? 0 : own[i];
  return out;
}

}  // namespace tessera
