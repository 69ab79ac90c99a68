// take (embedding lookup), take_along_axis, one_hot.
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/indexing.h"

namespace tessera {
namespace {

Array as_index(const Array& indices, const char* op) {
  if (!is_integral(indices.dtype()))
    fail<DTypeError>("{}: indices must be an integer array (got {})", op, name(indices.dtype()));
  return astype(indices, DType::Int64);
}

}  // namespace

Array take(const Array& a, const Array& indices, int axis_in) {
  int axis = normalize_axis(axis_in, a.ndim(), "take");
  Array idx = as_index(indices, "take");
  Shape shape(a.shape().begin(), a.shape().begin() + axis);
  shape.insert(shape.end(), idx.shape().begin(), idx.shape().end());
  shape.insert(shape.end(), a.shape().begin() + axis + 1, a.shape().end());
  return Array::make(shape, a.dtype(), std::make_shared<Take>(axis), {a, idx});
}

Array take_along_axis(const Array& a, const Array& indices, int axis_in) {
  int axis = normalize_axis(axis_in, a.ndim(), "take_along_axis");
  Array idx = as_index(indices, "take_along_axis");
  bool ok = idx.ndim() == a.ndim();
  for (int i = 0; ok && i < a.ndim(); ++i) ok = i == axis || idx.shape()[i] == a.shape()[i];
  if (!ok)
    fail<ShapeError>(
        "take_along_axis: indices of shape {} do not match array of shape {} outside axis {} (expected "
        "the same rank and equal dims except along the axis)",
        to_string(idx.shape()), to_string(a.shape()), axis);
  return Array::make(idx.shape(), a.dtype(), std::make_shared<TakeAlong>(axis), {a, idx});
}

Array one_hot(const Array& indices, int64_t num_classes, DType dtype) {
  if (num_classes < 0) fail<ValueError>("one_hot: num_classes {} is negative", num_classes);
  Array idx = as_index(indices, "one_hot");
  Array classes = arange(num_classes);
  return astype(equal(expand_dims(idx, -1), classes), dtype);
}

}  // namespace tessera
