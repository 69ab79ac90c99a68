// tessera.Array: the C++ Array (a lazy, immutable handle) with its NumPy interchange.
//
// To NumPy no bytes are copied: _raw_view() returns a read-only ndarray over the array's
// own buffer (an unsigned integer type of the element's size; the Python layer views it
// as the real dtype, so bfloat16 and float16 need nothing from nanobind's dtype table),
// and the ndarray keeps the Array, hence its buffer, alive. From NumPy and DLPack the
// bytes are copied once into a 64-byte aligned tessera buffer: tessera arrays are
// immutable, and a NumPy array can be written after the call.
#include <nanobind/ndarray.h>

#include <cstring>
#include <sstream>

#include "bindings.h"
#include "tessera/core/ops.h"

namespace tessera::python {
namespace {

// The DType of a DLPack element type, or false.
bool dtype_of(const nb::dlpack::dtype& t, DType* out) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(t.code);
  if (t.lanes != 1) return false;
  if (code == Code::Bool && t.bits == 8) return *out = DType::Bool, true;
  if (code == Code::UInt && t.bits == 8) return *out = DType::UInt8, true;
  if (code == Code::UInt && t.bits == 32) return *out = DType::UInt32, true;
  if (code == Code::Int && t.bits == 8) return *out = DType::Int8, true;
  if (code == Code::Int && t.bits == 32) return *out = DType::Int32, true;
  if (code == Code::Int && t.bits == 64) return *out = DType::Int64, true;
  if (code == Code::Float && t.bits == 16) return *out = DType::Float16, true;
  if (code == Code::Float && t.bits == 32) return *out = DType::Float32, true;
  if (code == Code::Float && t.bits == 64) return *out = DType::Float64, true;
  if (code == Code::Bfloat && t.bits == 16) return *out = DType::BFloat16, true;
  return false;
}

using HostArray = nb::ndarray<nb::ro, nb::device::cpu>;

// A copy of a CPU ndarray (any strides) as a tessera Array. `dtype_name` given: the
// elements are reinterpreted as that dtype (the Python layer passes a bfloat16 NumPy
// array viewed as uint16).
Array from_ndarray(const HostArray& a, std::optional<std::string> dtype_name) {
  DType dtype;
  if (dtype_name) {
    if (!dtype_from_name(*dtype_name, &dtype)) throw nb::type_error(("tessera has no dtype " + *dtype_name).c_str());
  } else if (!dtype_of(a.dtype(), &dtype)) {
    throw nb::type_error(fmt::format("tessera.array: no tessera dtype for the DLPack type (code {}, {} bits, {} "
                                     "lanes); tessera has bool, uint8, int8, uint32, int32, int64, float16, "
                                     "bfloat16, float32, float64",
                                     static_cast<int>(a.dtype().code), a.dtype().bits, a.dtype().lanes)
                             .c_str());
  }
  const size_t item = itemsize(dtype);
  if (static_cast<size_t>(a.dtype().bits) / 8 != item)
    throw nb::type_error(fmt::format("tessera.array: {} elements are {} bytes, the buffer's are {}", name(dtype), item,
                                     a.dtype().bits / 8)
                             .c_str());
  Shape shape(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) shape[d] = static_cast<int64_t>(a.shape(d));
  // Contiguous row-major: one copy. Otherwise element by element (strides in elements).
  bool contiguous = true;
  int64_t expected = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (shape[d] != 1 && a.stride(d) != expected) contiguous = false;
    expected *= shape[d];
  }
  const auto* src = static_cast<const uint8_t*>(a.data());
  if (contiguous) return Array::from_data(src, shape, dtype);
  Array out = Array::empty(shape, dtype);
  auto* dst = static_cast<uint8_t*>(out.mutable_raw_data());
  const int64_t n = numel(shape);
  std::vector<int64_t> index(a.ndim(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < a.ndim(); ++d) offset += index[d] * a.stride(d);
    std::memcpy(dst + static_cast<size_t>(i) * item, src + offset * static_cast<int64_t>(item), item);
    for (size_t d = a.ndim(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

// A read-only ndarray of unsigned integers of the element size over the array's buffer.
nb::ndarray<nb::numpy, nb::ro> raw_view(const Array& a) {
  {
    nb::gil_scoped_release release;
    a.eval();
    (void)a.raw_data();  // a sharded or device array is assembled on the host here
  }
  nb::dlpack::dtype t{static_cast<uint8_t>(nb::dlpack::dtype_code::UInt), static_cast<uint8_t>(a.itemsize() * 8), 1};
  std::vector<size_t> shape(a.shape().begin(), a.shape().end());
  auto* keep = new Array(a);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Array*>(p); });
  return nb::ndarray<nb::numpy, nb::ro>(const_cast<void*>(a.raw_data()), shape.size(), shape.data(), owner, nullptr, t);
}

// The same buffer typed for DLPack consumers (bfloat16 and float16 included).
nb::ndarray<nb::ro> dlpack_view(const Array& a) {
  {
    nb::gil_scoped_release release;
    a.eval();
    (void)a.raw_data();
  }
  using Code = nb::dlpack::dtype_code;
  Code code = Code::Float;
  switch (a.dtype()) {
    case DType::Bool:
      code = Code::Bool;
      break;
    case DType::UInt8:
    case DType::UInt32:
      code = Code::UInt;
      break;
    case DType::Int8:
    case DType::Int32:
    case DType::Int64:
      code = Code::Int;
      break;
    case DType::BFloat16:
      code = Code::Bfloat;
      break;
    default:
      code = Code::Float;
      break;
  }
  nb::dlpack::dtype t{static_cast<uint8_t>(code), static_cast<uint8_t>(a.itemsize() * 8), 1};
  std::vector<size_t> shape(a.shape().begin(), a.shape().end());
  auto* keep = new Array(a);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Array*>(p); });
  return nb::ndarray<nb::ro>(const_cast<void*>(a.raw_data()), shape.size(), shape.data(), owner, nullptr, t);
}

nb::object item(const Array& a) {
  {
    nb::gil_scoped_release release;
    a.eval();
  }
  if (a.size() != 1)
    throw nb::value_error(
        fmt::format("only a one-element array converts to a Python scalar; this one has shape {}", to_string(a.shape()))
            .c_str());
  if (a.dtype() == DType::Bool) return nb::bool_(a.item<bool>());
  if (is_integral(a.dtype())) return nb::int_(a.item<int64_t>());
  return nb::float_(a.item<double>());
}

}  // namespace

void register_array(nb::module_& m) {
  nb::class_<Array>(m, "Array",
                    "A lazy, immutable n-dimensional array. Ops build a graph; values are computed when read "
                    "(NumPy conversion, item(), block_until_ready()) or inside a compiled function.")
      .def_prop_ro("shape", [](const Array& a) { return shape_tuple(a.shape()); })
      .def_prop_ro("ndim", &Array::ndim)
      .def_prop_ro("size", [](const Array& a) { return a.size(); })
      .def_prop_ro("itemsize", [](const Array& a) { return a.itemsize(); })
      .def_prop_ro("nbytes", [](const Array& a) { return a.nbytes(); })
      .def_prop_ro("_dtype_name", [](const Array& a) { return std::string(name(a.dtype())); })
      .def_prop_ro("_id", [](const Array& a) { return a.id(); })
      .def_prop_ro("is_evaluated", [](const Array& a) { return a.is_evaluated(); })
      .def(
          "block_until_ready",
          [](const Array& a) {
            {
              nb::gil_scoped_release release;
              a.eval();
            }
            return a;
          },
          "Computes the value (if not yet computed) and returns the array.")
      .def("_raw_view", &raw_view)
      .def("_dlpack_view", &dlpack_view)
      .def("item", &item, "The value of a one-element array as a Python bool, int or float.")
      .def("__len__",
           [](const Array& a) {
             if (a.ndim() == 0) throw nb::type_error("len() of a 0-d array");
             return a.shape(0);
           })
      .def("__repr__",
           [](const Array& a) {
             {
               nb::gil_scoped_release release;
               a.eval();
             }
             std::ostringstream os;
             os << a;
             return os.str();
           })
      .def("__hash__",
           [](const Array&) -> Py_hash_t { throw nb::type_error("tessera.Array is unhashable (like numpy.ndarray)"); });

  m.def("_from_ndarray", &from_ndarray, nb::arg("array"), nb::arg("dtype").none() = nb::none(),
        "A copy of a CPU ndarray (NumPy, DLPack) as a tessera.Array.");
  m.def(
      "_scalar",
      [](double value, nb::handle dtype) { return Array::scalar(value, as_dtype(dtype, DType::Float32, "scalar")); },
      nb::arg("value"), nb::arg("dtype").none());
  m.def("_eval", [](const std::vector<Array>& arrays) {
    nb::gil_scoped_release release;
    eval(arrays);
  });
  m.def("_type_string", [](const Array& a) { return type_string(a); });
}

}  // namespace tessera::python
