// C++ errors become Python exceptions of the matching kind with the same message:
//
//   tessera::ShapeError        -> tessera.ShapeError(ValueError)
//   tessera::DTypeError        -> tessera.DTypeError(TypeError)
//   tessera::AxisError         -> tessera.AxisError(ValueError, IndexError)   (NumPy's)
//   tessera::ValueError        -> ValueError
//   tessera::TransformError    -> tessera.TransformError(TypeError)  (reading a traced
//                                 value, differentiating an integer: JAX's TypeErrors)
//   spmd::ShardingError        -> tessera.ShardingError(ValueError)
//   tessera::ConfigError       -> tessera.ConfigError(ValueError)
//   tessera::IOError           -> OSError
//   any other tessera::Error   -> tessera.Error(RuntimeError)
//
// A Python exception raised inside a traced function travels through the C++ transform
// as nanobind's python_error and comes out unchanged.
#include <Python.h>

#include "bindings.h"
#include "tessera/base/error.h"
#include "tessera/spmd/sharding.h"

namespace tessera::python {
namespace {

PyObject* g_shape_error = nullptr;
PyObject* g_dtype_error = nullptr;
PyObject* g_axis_error = nullptr;
PyObject* g_transform_error = nullptr;
PyObject* g_sharding_error = nullptr;
PyObject* g_config_error = nullptr;
PyObject* g_error = nullptr;

// A new exception class tessera.<name> deriving from `bases` (one type or a tuple).
PyObject* new_exception(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("tessera.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

}  // namespace

void register_errors(nb::module_& m) {
  g_error = new_exception(m, "Error", PyExc_RuntimeError, "An error of tessera's C++ core without a closer kind.");
  g_shape_error = new_exception(m, "ShapeError", PyExc_ValueError, "Shapes that do not fit the operation.");
  g_dtype_error = new_exception(m, "DTypeError", PyExc_TypeError, "A dtype the operation does not accept.");
  nb::object axis_bases = nb::make_tuple(nb::handle(PyExc_ValueError), nb::handle(PyExc_IndexError));
  g_axis_error = new_exception(m, "AxisError", axis_bases.ptr(), "An axis out of range (like numpy.AxisError).");
  g_transform_error = new_exception(m, "TransformError", PyExc_TypeError,
                                    "A transform cannot do what was asked: reading a traced value inside jit, "
                                    "differentiating an integer input or a non-scalar output.");
  g_sharding_error =
      new_exception(m, "ShardingError", PyExc_ValueError, "A layout that is invalid or cannot be derived.");
  g_config_error = new_exception(m, "ConfigError", PyExc_ValueError, "A training configuration that is invalid.");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ShapeError& e) {
      PyErr_SetString(g_shape_error, e.what());
    } catch (const DTypeError& e) {
      PyErr_SetString(g_dtype_error, e.what());
    } catch (const AxisError& e) {
      PyErr_SetString(g_axis_error, e.what());
    } catch (const TransformError& e) {
      PyErr_SetString(g_transform_error, e.what());
    } catch (const spmd::ShardingError& e) {
      PyErr_SetString(g_sharding_error, e.what());
    } catch (const ConfigError& e) {
      PyErr_SetString(g_config_error, e.what());
    } catch (const tessera::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const tessera::IOError& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });
}

}  // namespace tessera::python
