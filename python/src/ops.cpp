// The array operations of core/ops.h under NumPy's names and keywords (tessera.*).
// Arguments go through the conversions of bindings.h, so Python scalars, NumPy arrays
// and lists are accepted wherever an array is, and scalars are weakly typed.
#include "tessera/core/ops.h"

#include <fmt/format.h>

#include "bindings.h"

namespace tessera::python {
namespace {

using UnaryOp = Array (*)(const Array&);
using BinaryOp = Array (*)(const Array&, const Array&);

template <UnaryOp op>
Array unary(nb::handle x, const char* name) {
  return op(as_array(x, name));
}

template <BinaryOp op>
Array binary(nb::handle x1, nb::handle x2, const char* name) {
  auto [a, b] = as_operands(x1, x2, name);
  return op(a, b);
}

using Reduction = Array (*)(const Array&, const std::vector<int>&, bool);

// numpy: axis=() reduces nothing.
template <Reduction op>
Array reduce(nb::handle a, nb::handle axis, bool keepdims, const char* name) {
  Array x = as_array(a, name);
  std::vector<int> axes = as_axes(axis, name);
  if (axes.empty() && !axis.is_none()) return x;
  return op(x, axes, keepdims);
}

Array arg_reduce(Array (*op)(const Array&, int, bool), nb::handle a, nb::handle axis, bool keepdims, const char* name) {
  Array x = as_array(a, name);
  if (axis.is_none()) {
    Array flat = flatten(x);
    Array r = op(flat, 0, false);
    if (keepdims) r = reshape(r, Shape(static_cast<size_t>(x.ndim()), 1));
    return r;
  }
  return op(x, nb::cast<int>(axis), keepdims);
}

}  // namespace

void register_ops(nb::module_& m) {
  // ---- creation ----
  m.def(
      "zeros",
      [](nb::handle shape, nb::handle dtype) {
        return zeros(as_shape(shape, "zeros"), as_dtype(dtype, DType::Float32, "zeros"));
      },
      nb::arg("shape"), nb::arg("dtype").none() = nb::none());
  m.def(
      "ones",
      [](nb::handle shape, nb::handle dtype) {
        return ones(as_shape(shape, "ones"), as_dtype(dtype, DType::Float32, "ones"));
      },
      nb::arg("shape"), nb::arg("dtype").none() = nb::none());
  m.def(
      "full",
      [](nb::handle shape, double fill_value, nb::handle dtype) {
        return full(as_shape(shape, "full"), fill_value, as_dtype(dtype, DType::Float32, "full"));
      },
      nb::arg("shape"), nb::arg("fill_value"), nb::arg("dtype").none() = nb::none());
  m.def(
      "zeros_like",
      [](nb::handle a, nb::handle dtype) {
        Array x = as_array(a, "zeros_like");
        return zeros(x.shape(), as_dtype(dtype, x.dtype(), "zeros_like"));
      },
      nb::arg("a"), nb::arg("dtype").none() = nb::none());
  m.def(
      "ones_like",
      [](nb::handle a, nb::handle dtype) {
        Array x = as_array(a, "ones_like");
        return ones(x.shape(), as_dtype(dtype, x.dtype(), "ones_like"));
      },
      nb::arg("a"), nb::arg("dtype").none() = nb::none());
  m.def(
      "full_like",
      [](nb::handle a, double fill_value, nb::handle dtype) {
        Array x = as_array(a, "full_like");
        return full(x.shape(), fill_value, as_dtype(dtype, x.dtype(), "full_like"));
      },
      nb::arg("a"), nb::arg("fill_value"), nb::arg("dtype").none() = nb::none());
  m.def(
      "arange",
      [](double start, std::optional<double> stop, double step, nb::handle dtype) {
        // numpy: arange(stop) or arange(start, stop[, step]); integer arguments give int32
        // (JAX's default integer), a float argument float32.
        if (!stop) {
          stop = start;
          start = 0;
        }
        const bool integral = start == static_cast<int64_t>(start) && *stop == static_cast<int64_t>(*stop) &&
                              step == static_cast<int64_t>(step);
        return arange(start, *stop, step, as_dtype(dtype, integral ? DType::Int32 : DType::Float32, "arange"));
      },
      nb::arg("start"), nb::arg("stop").none() = nb::none(), nb::arg("step") = 1, nb::arg("dtype").none() = nb::none());

  // ---- elementwise ----
#define TESSERA_BINARY(py, cpp) \
  m.def(                        \
      py, [](nb::handle x1, nb::handle x2) { return binary<cpp>(x1, x2, py); }, nb::arg("x1"), nb::arg("x2"))
  TESSERA_BINARY("add", add);
  TESSERA_BINARY("subtract", subtract);
  TESSERA_BINARY("multiply", multiply);
  // Python's `/` is true division: integer (and bool) operands divide as float32 (JAX's
  // result type; the C++ divide of two integers truncates, docs/dtypes.md).
  for (const char* name : {"divide", "true_divide"}) {
    m.def(
        name,
        [name](nb::handle x1, nb::handle x2) {
          auto [a, b] = as_operands(x1, x2, name);
          if (!is_floating(a.dtype()) && !is_floating(b.dtype())) {
            a = astype(a, DType::Float32);
            b = astype(b, DType::Float32);
          }
          return divide(a, b);
        },
        nb::arg("x1"), nb::arg("x2"));
  }
  TESSERA_BINARY("power", power);
  TESSERA_BINARY("maximum", maximum);
  TESSERA_BINARY("minimum", minimum);
  TESSERA_BINARY("equal", equal);
  TESSERA_BINARY("not_equal", not_equal);
  TESSERA_BINARY("less", less);
  TESSERA_BINARY("less_equal", less_equal);
  TESSERA_BINARY("greater", greater);
  TESSERA_BINARY("greater_equal", greater_equal);
  TESSERA_BINARY("logical_and", logical_and);
  TESSERA_BINARY("logical_or", logical_or);
#undef TESSERA_BINARY
#define TESSERA_UNARY(py, cpp) \
  m.def(                       \
      py, [](nb::handle x) { return unary<cpp>(x, py); }, nb::arg("x"))
  TESSERA_UNARY("logical_not", logical_not);
  TESSERA_UNARY("negative", negative);
  TESSERA_UNARY("abs", abs);
  TESSERA_UNARY("absolute", abs);
  TESSERA_UNARY("sign", sign);
  TESSERA_UNARY("square", square);
  TESSERA_UNARY("exp", exp);
  TESSERA_UNARY("log", log);
  TESSERA_UNARY("log1p", log1p);
  TESSERA_UNARY("sqrt", sqrt);
  TESSERA_UNARY("rsqrt", rsqrt);
  TESSERA_UNARY("tanh", tanh);
  TESSERA_UNARY("erf", erf);
  TESSERA_UNARY("sin", sin);
  TESSERA_UNARY("cos", cos);
  TESSERA_UNARY("stop_gradient", stop_gradient);
#undef TESSERA_UNARY
  m.def(
      "where",
      [](nb::handle condition, nb::handle x, nb::handle y) {
        auto [a, b] = as_operands(x, y, "where", "x", "y");
        return where(as_array(condition, "where"), a, b);
      },
      nb::arg("condition"), nb::arg("x"), nb::arg("y"));
  m.def(
      "astype",
      [](nb::handle x, nb::handle dtype) {
        return astype(as_array(x, "astype"), as_dtype(dtype, DType::Float32, "astype"));
      },
      nb::arg("x"), nb::arg("dtype"));

  // ---- reductions ----
#define TESSERA_REDUCE(py, cpp)                                                                            \
  m.def(                                                                                                   \
      py, [](nb::handle a, nb::handle axis, bool keepdims) { return reduce<cpp>(a, axis, keepdims, py); }, \
      nb::arg("a"), nb::arg("axis").none() = nb::none(), nb::arg("keepdims") = false)
  TESSERA_REDUCE("sum", sum);
  TESSERA_REDUCE("mean", mean);
  TESSERA_REDUCE("max", max);
  TESSERA_REDUCE("min", min);
  TESSERA_REDUCE("amax", max);
  TESSERA_REDUCE("amin", min);
  TESSERA_REDUCE("prod", prod);
  TESSERA_REDUCE("var", var);
  TESSERA_REDUCE("logsumexp", logsumexp);
#undef TESSERA_REDUCE
  m.def(
      "argmax",
      [](nb::handle a, nb::handle axis, bool keepdims) { return arg_reduce(argmax, a, axis, keepdims, "argmax"); },
      nb::arg("a"), nb::arg("axis").none() = nb::none(), nb::arg("keepdims") = false);
  m.def(
      "argmin",
      [](nb::handle a, nb::handle axis, bool keepdims) { return arg_reduce(argmin, a, axis, keepdims, "argmin"); },
      nb::arg("a"), nb::arg("axis").none() = nb::none(), nb::arg("keepdims") = false);

  // ---- linear algebra ----
  m.def(
      "matmul",
      [](nb::handle a, nb::handle b) {
        auto [x, y] = as_operands(a, b, "matmul", "a", "b");
        return matmul(x, y);
      },
      nb::arg("a"), nb::arg("b"));
  m.def(
      "dot_general",
      [](nb::handle a, nb::handle b, std::vector<int> a_contract, std::vector<int> b_contract, std::vector<int> a_batch,
         std::vector<int> b_batch) {
        auto [x, y] = as_operands(a, b, "dot_general", "a", "b");
        return dot_general(x, y, a_contract, b_contract, a_batch, b_batch);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("a_contract"), nb::arg("b_contract"), nb::arg("a_batch") = std::vector<int>{},
      nb::arg("b_batch") = std::vector<int>{});

  // ---- layout ----
  m.def(
      "reshape",
      [](nb::handle a, nb::handle shape) { return reshape(as_array(a, "reshape"), as_shape(shape, "reshape")); },
      nb::arg("a"), nb::arg("shape"));
  m.def(
      "transpose",
      [](nb::handle a, nb::handle axes) {
        return transpose(as_array(a, "transpose"), axes.is_none() ? std::vector<int>{} : as_axes(axes, "transpose"));
      },
      nb::arg("a"), nb::arg("axes").none() = nb::none());
  m.def(
      "swapaxes", [](nb::handle a, int axis1, int axis2) { return swapaxes(as_array(a, "swapaxes"), axis1, axis2); },
      nb::arg("a"), nb::arg("axis1"), nb::arg("axis2"));
  m.def(
      "moveaxis",
      [](nb::handle a, int source, int destination) { return moveaxis(as_array(a, "moveaxis"), source, destination); },
      nb::arg("a"), nb::arg("source"), nb::arg("destination"));
  m.def(
      "expand_dims",
      [](nb::handle a, nb::handle axis) {
        Array x = as_array(a, "expand_dims");
        std::vector<int> axes = as_axes(axis, "expand_dims");
        const int rank = x.ndim() + static_cast<int>(axes.size());
        for (int& ax : axes) ax = ax < 0 ? ax + rank : ax;
        std::sort(axes.begin(), axes.end());
        for (int ax : axes) x = expand_dims(x, ax);
        return x;
      },
      nb::arg("a"), nb::arg("axis"));
  m.def(
      "squeeze",
      [](nb::handle a, nb::handle axis) { return squeeze(as_array(a, "squeeze"), as_axes(axis, "squeeze")); },
      nb::arg("a"), nb::arg("axis").none() = nb::none());
  m.def(
      "broadcast_to",
      [](nb::handle a, nb::handle shape) {
        return broadcast_to(as_array(a, "broadcast_to"), as_shape(shape, "broadcast_to"));
      },
      nb::arg("array"), nb::arg("shape"));
  m.def(
      "concatenate",
      [](nb::handle arrays, int axis) { return concatenate(as_array_list(arrays, "concatenate"), axis); },
      nb::arg("arrays"), nb::arg("axis") = 0);
  m.def(
      "stack", [](nb::handle arrays, int axis) { return stack(as_array_list(arrays, "stack"), axis); },
      nb::arg("arrays"), nb::arg("axis") = 0);
  m.def(
      "ravel", [](nb::handle a) { return flatten(as_array(a, "ravel")); }, nb::arg("a"));
  m.def(
      "_slice",
      [](const Array& a, std::vector<int64_t> start, std::vector<int64_t> stop, std::vector<int64_t> step) {
        return slice(a, std::move(start), std::move(stop), std::move(step));
      },
      nb::arg("a"), nb::arg("start"), nb::arg("stop"), nb::arg("step"));

  // ---- indexing ----
  m.def(
      "take",
      [](nb::handle a, nb::handle indices, nb::handle axis) {
        Array x = as_array(a, "take");
        Array idx = as_array(indices, "take");
        if (axis.is_none()) return take(flatten(x), idx, 0);
        return take(x, idx, nb::cast<int>(axis));
      },
      nb::arg("a"), nb::arg("indices"), nb::arg("axis").none() = nb::none());
  m.def(
      "take_along_axis",
      [](nb::handle a, nb::handle indices, int axis) {
        return take_along_axis(as_array(a, "take_along_axis"), as_array(indices, "take_along_axis"), axis);
      },
      nb::arg("arr"), nb::arg("indices"), nb::arg("axis"));
}

}  // namespace tessera::python
