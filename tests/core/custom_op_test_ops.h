// Custom ops the custom-op tests share (tests/core, tests/compiler, tests/spmd,
// tests/cuda), registered once per process by register_test_custom_ops():
//   test_poly(x; a, b)        y = a*x^2 + b*x, float32 or float64, vjp written with ops
//   test_row_cumsum(x)        y[i, j] = sum_{k<=j} x[i, k] over rank-2 float32 input;
//                             vjp is the custom op test_row_rcumsum (reverse cumsum)
//                             and vice versa; rows shard freely ("r c -> r c", {r})
//   test_row_cumsum_gathered  the same kernel declared unsharded_only
#pragma once

#include <mutex>

#include "tessera/core/custom_op.h"
#include "tessera/core/ops.h"

namespace tessera::test {

inline std::vector<TensorSpec> same_as_input(const std::vector<TensorSpec>& in, const CustomAttributes&) {
  return {in[0]};
}

template <typename T>
void poly_kernel(const InputBuffer& x, const OutputBuffer& y, double a, double b) {
  const T* in = x.as<T>();
  T* out = y.as<T>();
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = static_cast<T>(a * in[i] * in[i] + b * in[i]);
}

// Cumulative sums along each row, forwards or backwards.
inline void row_scan(const InputBuffer& x, const OutputBuffer& y, bool reverse) {
  const int64_t rows = x.shape[0], cols = x.shape[1];
  const float* in = x.as<float>();
  float* out = y.as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float acc = 0;
    for (int64_t k = 0; k < cols; ++k) {
      int64_t c = reverse ? cols - 1 - k : k;
      acc += in[r * cols + c];
      out[r * cols + c] = acc;
    }
  }
}

inline std::vector<TensorSpec> matrix_like(const std::vector<TensorSpec>& in, const CustomAttributes&) {
  if (in[0].shape.size() != 2)
    fail<ShapeError>("test_row_cumsum: input 0 has shape {} (expected rank 2)", to_string(in[0].shape));
  return {in[0]};
}

inline CustomOpDefinition row_scan_op(const std::string& name, bool reverse, const std::string& transpose,
                                      CustomSharding sharding) {
  CustomOpDefinition d;
  d.name = name;
  d.num_inputs = 1;
  d.input_dtypes = {DType::Float32};
  d.infer = matrix_like;
  d.cpu_kernel = [reverse](const std::vector<InputBuffer>& in, const std::vector<OutputBuffer>& out,
                           const CustomAttributes&) { row_scan(in[0], out[0], reverse); };
  // The transpose of a forward scan is the backward scan: another custom op.
  d.vjp = [transpose](const std::vector<Array>&, const std::vector<Array>& ct, const std::vector<Array>&,
                      const CustomAttributes&) { return custom_op(transpose, {ct[0]}); };
  d.sharding = std::move(sharding);
  return d;
}

inline void register_test_custom_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    CustomOpDefinition poly;
    poly.name = "test_poly";
    poly.num_inputs = 1;
    poly.infer = [](const std::vector<TensorSpec>& in, const CustomAttributes& at) {
      attribute_double(at, "a", "test_poly");  // required: refused at the call, not at run time
      attribute_double(at, "b", "test_poly");
      if (in[0].dtype != DType::Float32 && in[0].dtype != DType::Float64)
        fail<DTypeError>("test_poly: input 0 is {} (expected float32 or float64)", name(in[0].dtype));
      return std::vector<TensorSpec>{in[0]};
    };
    poly.cpu_kernel = [](const std::vector<InputBuffer>& in, const std::vector<OutputBuffer>& out,
                         const CustomAttributes& at) {
      double a = attribute_double(at, "a", "test_poly"), b = attribute_double(at, "b", "test_poly");
      if (in[0].dtype == DType::Float64) {
        poly_kernel<double>(in[0], out[0], a, b);
      } else {
        poly_kernel<float>(in[0], out[0], a, b);
      }
    };
    poly.vjp = [](const std::vector<Array>& x, const std::vector<Array>& ct, const std::vector<Array>&,
                  const CustomAttributes& at) {
      double a = attribute_double(at, "a", "test_poly"), b = attribute_double(at, "b", "test_poly");
      Array slope = add(multiply(x[0], Array::scalar(2 * a, x[0].dtype())), Array::scalar(b, x[0].dtype()));
      return std::vector<Array>{multiply(ct[0], slope)};
    };
    poly.sharding = CustomSharding::factors("i j -> i j", {"i", "j"});
    poly.cost = [](const std::vector<TensorSpec>&, const std::vector<TensorSpec>& out, const CustomAttributes&) {
      return Cost{4.0 * static_cast<double>(numel(out[0].shape)), 0.0};
    };
    register_custom_op(std::move(poly));
    register_custom_op(
        row_scan_op("test_row_cumsum", false, "test_row_rcumsum", CustomSharding::factors("r c -> r c", {"r"})));
    register_custom_op(
        row_scan_op("test_row_rcumsum", true, "test_row_cumsum", CustomSharding::factors("r c -> r c", {"r"})));
    register_custom_op(
        row_scan_op("test_row_cumsum_gathered", false, "test_row_rcumsum", CustomSharding::unsharded_only()));
  });
}

inline Array test_poly(const Array& x, double a, double b) {
  return custom_op("test_poly", {x}, {{"a", a}, {"b", b}})[0];
}

}  // namespace tessera::test
