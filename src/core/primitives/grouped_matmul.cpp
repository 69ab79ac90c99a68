// Builders, vjp and cost of the grouped matmuls (ir/primitives/grouped_matmul.h).
#include "tessera/ir/primitives/grouped_matmul.h"

#include <fmt/format.h>

#include "tessera/core/ops.h"

namespace tessera {

namespace {

// sizes [G, E], or [S, G, E] for a sharded operand [S, G, N, .] (`lead` its S and G).
void check_sizes(const char* op, const Array& sizes, const Shape& lead) {
  if (sizes.dtype() != DType::Int32 && sizes.dtype() != DType::Int64)
    fail<DTypeError>("{}: group sizes of dtype {} (expected int32 or int64)", op, name(sizes.dtype()));
  const auto rank = static_cast<int>(lead.size()) + 1;
  bool fits = sizes.ndim() == rank;
  for (size_t d = 0; fits && d < lead.size(); ++d) fits = sizes.shape(static_cast<int>(d)) == lead[d];
  if (!fits)
    fail<ShapeError>("{}: group sizes {} (expected [{}, groups]: one row per batch)", op, to_string(sizes.shape()),
                     lead.size() == 1 ? std::to_string(lead[0]) : fmt::format("{}, {}", lead[0], lead[1]));
}

// The leading dims of a grouped operand: [G] for [G, N, K], [S, G] for [S, G, N, K].
Shape batch_dims(const Array& a) { return Shape(a.shape().begin(), a.shape().end() - 2); }

void check_floating(const char* op, const Array& a, const Array& b) {
  if (a.dtype() != b.dtype())
    fail<DTypeError>("{}: operand dtypes differ ({} and {})", op, name(a.dtype()), name(b.dtype()));
  if (!is_floating(a.dtype())) fail<DTypeError>("{}: {} operands (expected a floating dtype)", op, name(a.dtype()));
}

}  // namespace

Array grouped_matmul_op(const Array& a, const Array& w, const Array& sizes, bool trans_w) {
  if ((a.ndim() != 3 && a.ndim() != 4) || w.ndim() != a.ndim() || (a.ndim() == 4 && w.shape(0) != a.shape(0)))
    fail<ShapeError>(
        "grouped_matmul: a {} and w {} (expected a [batch, rows, K] and w [groups, K, M], or a [shards, batch, rows, "
        "K] and w [shards, groups, K, M])",
        to_string(a.shape()), to_string(w.shape()));
  check_floating("grouped_matmul", a, w);
  const Shape lead = batch_dims(a);
  check_sizes("grouped_matmul", sizes, lead);
  const int64_t k = w.shape(trans_w ? -1 : -2), m = w.shape(trans_w ? -2 : -1);
  if (a.shape(-1) != k)
    fail<ShapeError>("grouped_matmul: a {} has K={} but w {}{} has K={}", to_string(a.shape()), a.shape(-1),
                     to_string(w.shape()), trans_w ? " (transposed)" : "", k);
  if (sizes.shape(-1) != w.shape(-3))
    fail<ShapeError>("grouped_matmul: group sizes {} for the {} matrices of w {}", to_string(sizes.shape()),
                     w.shape(-3), to_string(w.shape()));
  Shape out = lead;
  out.push_back(a.shape(-2));
  out.push_back(m);
  return Array::make(std::move(out), a.dtype(), std::make_shared<GroupedMatmul>(trans_w), {a, w, sizes});
}

Array grouped_matmul_weight_grad_op(const Array& x, const Array& y, const Array& sizes, bool trans_out) {
  if ((x.ndim() != 3 && x.ndim() != 4) || y.ndim() != x.ndim() || batch_dims(x) != batch_dims(y) ||
      x.shape(-2) != y.shape(-2))
    fail<ShapeError>(
        "grouped_matmul_weight_grad: x {} and y {} (expected [batch, rows, K] and [batch, rows, M], or both with a "
        "leading shard dim)",
        to_string(x.shape()), to_string(y.shape()));
  check_floating("grouped_matmul_weight_grad", x, y);
  check_sizes("grouped_matmul_weight_grad", sizes, batch_dims(x));
  const int64_t e = sizes.shape(-1), k = x.shape(-1), m = y.shape(-1);
  Shape out = x.ndim() == 4 ? Shape{x.shape(0)} : Shape{};
  for (int64_t d : trans_out ? Shape{e, m, k} : Shape{e, k, m}) out.push_back(d);
  return Array::make(std::move(out), x.dtype(), std::make_shared<GroupedMatmulWeightGrad>(e, trans_out), {x, y, sizes});
}

Array grouped_matmul(const Array& a, const Array& w, const Array& sizes, bool trans_w) {
  return grouped_matmul_op(a, w, sizes, trans_w);
}

std::string GroupedMatmul::attributes() const {
  std::string s = trans_w_ ? "trans_w=true" : "";
  if (row_shards_ != 1) s += fmt::format("{}row_shards={}", s.empty() ? "" : ", ", row_shards_);
  return s;
}

std::string GroupedMatmulWeightGrad::attributes() const {
  return fmt::format("groups={}{}{}", groups_, trans_out_ ? ", trans_out=true" : "",
                     row_shards_ != 1 ? fmt::format(", row_shards={}", row_shards_) : "");
}

namespace {
// The batches' used rows: all of them, or with a shard dim (or row_shards) their share.
double used_share(const Array& operand, int64_t row_shards) {
  const double shards = operand.ndim() == 4 ? static_cast<double>(operand.shape(0)) : 1.0;
  return 1.0 / (shards * static_cast<double>(row_shards));
}
}  // namespace

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
  c.flops = 2.0 * static_cast<double>(outputs[0].size()) * static_cast<double>(inputs[0].shape(-1)) *
            used_share(inputs[0], row_shards_);
  return c;
}

Cost GroupedMatmulWeightGrad::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = 2.0 * static_cast<double>(inputs[0].size()) * static_cast<double>(inputs[1].shape(-1)) *
            used_share(inputs[0], row_shards_);
  return c;
}

}  // namespace tessera
