// Builders, vjp and cost of the grouped matmuls (ir/primitives/grouped_matmul.h).
#include "tessera/ir/primitives/grouped_matmul.h"

#include <fmt/format.h>

#include "tessera/core/ops.h"

namespace tessera {

namespace {

void check_sizes(const char* op, const Array& sizes, int64_t batches) {
  if (sizes.dtype() != DType::Int32 && sizes.dtype() != DType::Int64)
    fail<DTypeError>("{}: group sizes of dtype {} (expected int32 or int64)", op, name(sizes.dtype()));
  if (sizes.ndim() != 2 || sizes.shape(0) != batches)
    fail<ShapeError>("{}: group sizes {} (expected [{}, groups]: one row per batch)", op, to_string(sizes.shape()),
                     batches);
}

void check_floating(const char* op, const Array& a, const Array& b) {
  if (a.dtype() != b.dtype())
    fail<DTypeError>("{}: operand dtypes differ ({} and {})", op, name(a.dtype()), name(b.dtype()));
  if (!is_floating(a.dtype())) fail<DTypeError>("{}: {} operands (expected a floating dtype)", op, name(a.dtype()));
}

}  // namespace

Array grouped_matmul_op(const Array& a, const Array& w, const Array& sizes, bool trans_w) {
  if (a.ndim() != 3 || w.ndim() != 3)
    fail<ShapeError>("grouped_matmul: a {} and w {} (expected a [batch, rows, K] and w [groups, K, M])",
                     to_string(a.shape()), to_string(w.shape()));
  check_floating("grouped_matmul", a, w);
  check_sizes("grouped_matmul", sizes, a.shape(0));
  const int64_t k = w.shape(trans_w ? 2 : 1), m = w.shape(trans_w ? 1 : 2);
  if (a.shape(2) != k)
    fail<ShapeError>("grouped_matmul: a {} has K={} but w {}{} has K={}", to_string(a.shape()), a.shape(2),
                     to_string(w.shape()), trans_w ? " (transposed)" : "", k);
  if (sizes.shape(1) != w.shape(0))
    fail<ShapeError>("grouped_matmul: group sizes {} for the {} matrices of w {}", to_string(sizes.shape()), w.shape(0),
                     to_string(w.shape()));
  return Array::make({a.shape(0), a.shape(1), m}, a.dtype(), std::make_shared<GroupedMatmul>(trans_w), {a, w, sizes});
}

Array grouped_matmul_weight_grad_op(const Array& x, const Array& y, const Array& sizes, bool trans_out) {
  if (x.ndim() != 3 || y.ndim() != 3 || x.shape(0) != y.shape(0) || x.shape(1) != y.shape(1))
    fail<ShapeError>("grouped_matmul_weight_grad: x {} and y {} (expected [batch, rows, K] and [batch, rows, M])",
                     to_string(x.shape()), to_string(y.shape()));
  check_floating("grouped_matmul_weight_grad", x, y);
  check_sizes("grouped_matmul_weight_grad", sizes, x.shape(0));
  const int64_t e = sizes.shape(1), k = x.shape(2), m = y.shape(2);
  return Array::make(trans_out ? Shape{e, m, k} : Shape{e, k, m}, x.dtype(),
                     std::make_shared<GroupedMatmulWeightGrad>(e, trans_out), {x, y, sizes});
}

Array grouped_matmul(const Array& a, const Array& w, const Array& sizes, bool trans_w) {
  return grouped_matmul_op(a, w, sizes, trans_w);
}

std::string GroupedMatmul::attributes() const { return trans_w_ ? "trans_w=true" : std::string(); }

std::string GroupedMatmulWeightGrad::attributes() const {
  return fmt::format("groups={}{}", groups_, trans_out_ ? ", trans_out=true" : "");
}

// out_g = a_g W_e per group, W = w[e] or w[e]^T:
//   da = dout W^T: grouped_matmul(dout, w, !trans_w);
//   dw[e] = a_e^T dout_e, or its transpose when w is stored transposed.
std::vector<Array> GroupedMatmul::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                      const std::vector<int>& argnums, const std::vector<Array>&) {
  const Array& a = primals[0];
  const Array& w = primals[1];
  const Array& sizes = primals[2];
  const Array& g = cotangents[0];
  std::vector<Array> result;
  for (int arg : argnums) {
    if (arg == 0)
      result.push_back(grouped_matmul_op(g, w, sizes, !trans_w_));
    else if (arg == 1)
      result.push_back(grouped_matmul_weight_grad_op(a, g, sizes, trans_w_));
    else
      result.push_back(zeros(sizes.shape(), sizes.dtype()));  // integer sizes: no gradient
  }
  return result;
}

// out[e] = x_e^T y_e (or y_e^T x_e with trans_out):
//   dx_e = y_e dout_e^T (y_e dout_e with trans_out) and dy_e = x_e dout_e (x_e dout_e^T).
std::vector<Array> GroupedMatmulWeightGrad::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                                const std::vector<int>& argnums, const std::vector<Array>&) {
  const Array& x = primals[0];
  const Array& y = primals[1];
  const Array& sizes = primals[2];
  const Array& g = cotangents[0];
  std::vector<Array> result;
  for (int arg : argnums) {
    if (arg == 0)
      result.push_back(grouped_matmul_op(y, g, sizes, !trans_out_));
    else if (arg == 1)
      result.push_back(grouped_matmul_op(x, g, sizes, trans_out_));
    else
      result.push_back(zeros(sizes.shape(), sizes.dtype()));
  }
  return result;
}

Cost GroupedMatmul::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = 2.0 * static_cast<double>(outputs[0].size()) * static_cast<double>(inputs[0].shape(2));
  return c;
}

Cost GroupedMatmulWeightGrad::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = 2.0 * static_cast<double>(inputs[0].size()) * static_cast<double>(inputs[1].shape(2));
  return c;
}

}  // namespace tessera
