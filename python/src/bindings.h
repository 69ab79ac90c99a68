// What the files of python/src/ share: the registration function of each part and the
// conversions from Python values (arrays, scalars, dtypes, shapes, axes) that every
// binding uses, so the Python layer can hand user arguments straight to C++.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/array.h"

namespace tessera::python {

namespace nb = nanobind;

void register_errors(nb::module_& m);
void register_conversions(nb::module_& m);
void register_array(nb::module_& m);
void register_ops(nb::module_& m);
void register_nn_ops(nb::module_& m);
void register_transforms(nb::module_& m);
void register_spmd(nb::module_& m);
void register_info(nb::module_& m);
void register_training(nb::module_& m);
void register_goodput(nb::module_& m);
void register_compilation_cache(nb::module_& m);
void register_nn_modules(nb::module_& m);

// A tessera Array from `value`: an Array as is; a Python bool, int or float as a scalar
// (bool, int32, float32: JAX's defaults) or, with `like`, in `like`'s dtype (weak typing:
// x * 2.0 keeps x's bfloat16); anything else (NumPy arrays, nested lists, objects with
// __array__ or __dlpack__) through tessera's Python converter. `what` names the argument
// in errors ("add: argument 'x1'").
Array as_array(nb::handle value, const char* what, const Array* like = nullptr);
// Two operands of a binary op; a Python scalar takes the other operand's dtype.
// `a_name` / `b_name` name them in errors ("add: argument 'x1': ...").
std::pair<Array, Array> as_operands(nb::handle a, nb::handle b, const char* op, const char* a_name = "x1",
                                    const char* b_name = "x2");
// Optional array argument (None: absent).
std::optional<Array> as_optional_array(nb::handle value, const char* what);
// A list of arrays (a list, tuple or other sequence of array-likes).
std::vector<Array> as_array_list(nb::handle values, const char* what);
// numpy-style dtype argument: a name ("float32", "bf16"), a NumPy dtype or scalar type
// (np.float32, ml_dtypes.bfloat16), or None (then `fallback`).
DType as_dtype(nb::handle value, DType fallback, const char* what);
// A shape: an int or a sequence of ints.
Shape as_shape(nb::handle value, const char* what);
// Reduction axes: None (every axis: the C++ convention, an empty list), an int, or a
// sequence of ints.
std::vector<int> as_axes(nb::handle value, const char* what);
// Whether the Python value is a bool, int or float (not an array).
bool is_python_scalar(nb::handle value);
// The Python tuple of a shape.
nb::tuple shape_tuple(const Shape& shape);

// A Python callable held by C++ code that may copy or drop it without the GIL (the
// compiled function of a Jitted, which outlives the call that made it): copies share one
// reference, and the last one releases it holding the GIL.
class PythonCallable {
 public:
  explicit PythonCallable(nb::callable fn);
  // Calls with the GIL held (acquired when the caller released it).
  nb::object operator()(nb::handle arg) const;

 private:
  std::shared_ptr<nb::callable> fn_;
};

}  // namespace tessera::python
