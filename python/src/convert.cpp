// Conversions from Python values to the C++ API's types (bindings.h).
#include <fmt/format.h>

#include "bindings.h"
#include "tessera/core/ops.h"

namespace tessera::python {
namespace {

// tessera._convert.array_from_object (set at import): NumPy arrays, lists, __array__ and
// __dlpack__ objects.
nb::object g_array_converter;
// numpy.dtype, for dtype arguments given as NumPy types.
nb::object g_numpy_dtype;

}  // namespace

bool is_python_scalar(nb::handle value) {
  return PyBool_Check(value.ptr()) || PyLong_CheckExact(value.ptr()) || PyFloat_CheckExact(value.ptr());
}

Array as_array(nb::handle value, const char* what, const Array* like) {
  if (nb::isinstance<Array>(value)) return nb::cast<Array>(value);
  PyObject* p = value.ptr();
  if (PyBool_Check(p)) {
    // A bool stays bool (promotion then follows the other operand, as in JAX).
    return Array::scalar(p == Py_True ? 1 : 0, DType::Bool);
  }
  // Exact types: NumPy's float64 and int64 scalars subclass Python's and keep their dtype.
  if (PyLong_CheckExact(p)) {
    const double v = static_cast<double>(nb::cast<int64_t>(value));
    if (like != nullptr) return scalar_like(v, *like);
    return Array::scalar(v, DType::Int32);
  }
  if (PyFloat_CheckExact(p)) {
    const double v = PyFloat_AS_DOUBLE(p);
    if (like != nullptr) return scalar_like(v, *like);
    return Array::scalar(v, DType::Float32);
  }
  if (value.is_none()) throw nb::type_error(fmt::format("{}: expected an array, got None", what).c_str());
  if (!g_array_converter.is_valid()) throw nb::type_error("tessera: the array converter is not installed");
  return nb::cast<Array>(g_array_converter(value, what));
}

std::pair<Array, Array> as_operands(nb::handle a, nb::handle b, const char* op, const char* a_name,
                                    const char* b_name) {
  const std::string a_what = fmt::format("{}: argument '{}'", op, a_name);
  const std::string b_what = fmt::format("{}: argument '{}'", op, b_name);
  const bool a_array = nb::isinstance<Array>(a);
  const bool b_array = nb::isinstance<Array>(b);
  if (a_array && b_array) return {nb::cast<Array>(a), nb::cast<Array>(b)};
  if (a_array && is_python_scalar(b)) {
    Array x = nb::cast<Array>(a);
    return {x, as_array(b, b_what.c_str(), &x)};
  }
  if (b_array && is_python_scalar(a)) {
    Array y = nb::cast<Array>(b);
    return {as_array(a, a_what.c_str(), &y), y};
  }
  Array x = as_array(a, a_what.c_str());
  return {x, as_array(b, b_what.c_str(), &x)};
}

std::optional<Array> as_optional_array(nb::handle value, const char* what) {
  if (value.is_none()) return std::nullopt;
  return as_array(value, what);
}

std::vector<Array> as_array_list(nb::handle values, const char* what) {
  if (nb::isinstance<Array>(values))
    throw nb::type_error(fmt::format("{}: expected a sequence of arrays, got one array", what).c_str());
  std::vector<Array> out;
  for (nb::handle item : nb::iter(values)) out.push_back(as_array(item, what));
  return out;
}

DType as_dtype(nb::handle value, DType fallback, const char* what) {
  if (value.is_none()) return fallback;
  std::string name;
  if (nb::isinstance<nb::str>(value)) {
    name = nb::cast<std::string>(value);
  } else {
    if (!g_numpy_dtype.is_valid()) g_numpy_dtype = nb::module_::import_("numpy").attr("dtype");
    try {
      name = nb::cast<std::string>(g_numpy_dtype(value).attr("name"));
    } catch (const nb::python_error&) {
      throw nb::type_error(fmt::format("{}: {} is not a dtype", what, nb::cast<std::string>(nb::repr(value))).c_str());
    }
  }
  DType dtype;
  if (!dtype_from_name(name, &dtype))
    throw nb::type_error(fmt::format("{}: tessera has no dtype '{}' (bool, uint8, int8, uint32, int32, int64, "
                                     "float16, bfloat16, float32, float64)",
                                     what, name)
                             .c_str());
  return dtype;
}

Shape as_shape(nb::handle value, const char* what) {
  if (PyLong_Check(value.ptr())) return Shape{nb::cast<int64_t>(value)};
  Shape shape;
  try {
    for (nb::handle d : nb::iter(value)) shape.push_back(nb::cast<int64_t>(d));
  } catch (const std::exception&) {
    throw nb::type_error(
        fmt::format("{}: a shape is an int or a sequence of ints, got {}", what, nb::cast<std::string>(nb::repr(value)))
            .c_str());
  }
  return shape;
}

std::vector<int> as_axes(nb::handle value, const char* what) {
  if (value.is_none()) return {};
  if (PyLong_Check(value.ptr())) return {nb::cast<int>(value)};
  std::vector<int> axes;
  try {
    for (nb::handle d : nb::iter(value)) axes.push_back(nb::cast<int>(d));
  } catch (const std::exception&) {
    throw nb::type_error(fmt::format("{}: axis is None, an int or a sequence of ints, got {}", what,
                                     nb::cast<std::string>(nb::repr(value)))
                             .c_str());
  }
  return axes;
}

nb::tuple shape_tuple(const Shape& shape) {
  nb::list dims;
  for (int64_t d : shape) dims.append(d);
  return nb::tuple(dims);
}

PythonCallable::PythonCallable(nb::callable fn)
    : fn_(new nb::callable(std::move(fn)), [](nb::callable* p) {
        nb::gil_scoped_acquire gil;
        delete p;
      }) {}

nb::object PythonCallable::operator()(nb::handle arg) const {
  nb::gil_scoped_acquire gil;
  return (*fn_)(arg);
}

void register_conversions(nb::module_& m) {
  m.def(
      "_set_array_converter", [](nb::callable fn) { g_array_converter = std::move(fn); },
      "Installs tessera._convert.array_from_object (called once at import).");
  // The converter must not outlive the interpreter's teardown of its module.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    g_array_converter = nb::object();
    g_numpy_dtype = nb::object();
  }));
}

}  // namespace tessera::python
