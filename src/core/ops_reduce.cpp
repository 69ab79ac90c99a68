// Reductions: axis normalization, keepdims, dtype rules.
#include <limits>

#include "tessera/core/ops.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera {
namespace {

Shape reduced_shape(const Shape& shape, const std::vector<int>& axes, bool keepdims) {
  Shape out;
  size_t next = 0;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (next < axes.size() && axes[next] == i) {
      ++next;
      if (keepdims) out.push_back(1);
    } else {
      out.push_back(shape[i]);
    }
  }
  return out;
}

Array reduce_op(ReduceKind kind, const char* op, const Array& a, const std::vector<int>& axes_in, bool keepdims) {
  std::vector<int> axes = normalize_axes(axes_in, a.ndim(), op, true);
  Array x = a;
  if (kind == ReduceKind::Sum || kind == ReduceKind::Prod) {
    // numpy: sums of bool and narrow ints accumulate in int64.
    if (x.dtype() == DType::Bool || (is_integral(x.dtype()) && x.dtype() != DType::Int64 && x.dtype() != DType::UInt32))
      x = astype(x, DType::Int64);
  } else {
    for (int ax : axes)
      if (a.shape()[ax] == 0)
        fail<ValueError>("{}: cannot reduce over axis {} of size 0 in shape {} (no identity for {})", op, ax,
                         to_string(a.shape()), op);
  }
  if (axes.empty()) return x;  // rank-0 input
  Array out = Array::make(reduced_shape(x.shape(), axes, false), x.dtype(), std::make_shared<Reduce>(kind, axes), {x});
  return keepdims ? reshape(out, reduced_shape(x.shape(), axes, true)) : out;
}

}  // namespace

Array sum(const Array& a, const std::vector<int>& axes, bool keepdims) {
  return reduce_op(ReduceKind::Sum, "sum", a, axes, keepdims);
}
Array prod(const Array& a, const std::vector<int>& axes, bool keepdims) {
  return reduce_op(ReduceKind::Prod, "prod", a, axes, keepdims);
}
Array max(const Array& a, const std::vector<int>& axes, bool keepdims) {
  return reduce_op(ReduceKind::Max, "max", a, axes, keepdims);
}
Array min(const Array& a, const std::vector<int>& axes, bool keepdims) {
  return reduce_op(ReduceKind::Min, "min", a, axes, keepdims);
}

Array mean(const Array& a, const std::vector<int>& axes_in, bool keepdims) {
  std::vector<int> axes = normalize_axes(axes_in, a.ndim(), "mean", true);
  int64_t count = 1;
  for (int ax : axes) count *= a.shape()[ax];
  Array x = is_floating(a.dtype()) ? a : astype(a, DType::Float32);
  return sum(x, axes, keepdims) * (1.0 / static_cast<double>(count));
}

Array var(const Array& a, const std::vector<int>& axes, bool keepdims) {
  Array x = is_floating(a.dtype()) ? a : astype(a, DType::Float32);
  Array centered = x - mean(x, axes, true);
  return mean(square(centered), axes, keepdims);
}

Array logsumexp(const Array& a, const std::vector<int>& axes, bool keepdims) {
  Array x = is_floating(a.dtype()) ? a : astype(a, DType::Float32);
  // max-shifted for stability; the shift carries no gradient (it cancels exactly).
  Array m = stop_gradient(max(x, axes, true));
  Array finite_m =
      where(equal(abs(m), full({}, std::numeric_limits<double>::infinity(), m.dtype())), zeros({}, m.dtype()), m);
  Array out = log(sum(exp(x - finite_m), axes, true)) + finite_m;
  if (keepdims) return out;
  std::vector<int> norm = normalize_axes(axes, a.ndim(), "logsumexp", true);
  return squeeze(out, norm);
}

static Array arg_reduce(bool is_max, const Array& a, int axis_in, bool keepdims) {
  const char* op = is_max ? "argmax" : "argmin";
  int axis = normalize_axis(axis_in, a.ndim(), op);
  if (a.shape()[axis] == 0)
    fail<ValueError>("{}: cannot take {} over axis {} of size 0 in shape {}", op, op, axis, to_string(a.shape()));
  Shape shape = reduced_shape(a.shape(), {axis}, false);
  Array out = Array::make(shape, DType::Int64, std::make_shared<ArgReduce>(is_max, axis), {a});
  return keepdims ? expand_dims(out, axis) : out;
}

Array argmax(const Array& a, int axis, bool keepdims) { return arg_reduce(true, a, axis, keepdims); }
Array argmin(const Array& a, int axis, bool keepdims) { return arg_reduce(false, a, axis, keepdims); }

}  // namespace tessera
