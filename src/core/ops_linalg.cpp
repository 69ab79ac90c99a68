// matmul (numpy semantics) and dot_general (XLA semantics) on the Matmul primitive.
#include <algorithm>

#include "tessera/core/ops.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/quantized.h"

namespace tessera {
namespace {

void check_matmul_dtype(DType dtype) {
  if (dtype == DType::Bool) fail<DTypeError>("matmul: bool operands are not supported (cast to a numeric dtype)");
}

Shape batch_of(const Array& x) { return Shape(x.shape().begin(), x.shape().end() - 2); }

}  // namespace

Array matmul_op(const Array& a, const Array& b, bool trans_a, bool trans_b) {
  if (a.ndim() < 2 || b.ndim() < 2)
    fail<ShapeError>("matmul: operands must have rank >= 2 (got {} and {})", to_string(a.shape()),
                     to_string(b.shape()));
  if (a.dtype() != b.dtype())
    fail<DTypeError>("matmul: operand dtypes differ ({} and {})", name(a.dtype()), name(b.dtype()));
  check_matmul_dtype(a.dtype());
  int64_t m = a.shape(trans_a ? -1 : -2), ka = a.shape(trans_a ? -2 : -1);
  int64_t kb = b.shape(trans_b ? -1 : -2), n = b.shape(trans_b ? -2 : -1);
  if (ka != kb)
    fail<ShapeError>("matmul: contracting dimensions differ: {} has K={} but {} has K={} (expected equal)",
                     to_string(a.shape()), ka, to_string(b.shape()), kb);
  Shape batch_a = batch_of(a), batch_b = batch_of(b);
  if (a.ndim() > 2 && b.ndim() > 2 && batch_a != batch_b)
    fail<ShapeError>("matmul: batch dimensions differ: {} vs {} (expected equal, or a rank-2 operand)",
                     to_string(a.shape()), to_string(b.shape()));
  Shape shape = a.ndim() > 2 ? batch_a : batch_b;
  shape.push_back(m);
  shape.push_back(n);
  return Array::make(shape, a.dtype(), std::make_shared<Matmul>(trans_a, trans_b), {a, b});
}

Array quantized_matmul(const Array& x_in, const Array& w_in, const QuantizedMatmulOptions& options) {
  if (x_in.ndim() < 1 || w_in.ndim() != 2)
    fail<ShapeError>("quantized_matmul: x {} and w {} (expected x [..., K] and w [K, N])", to_string(x_in.shape()),
                     to_string(w_in.shape()));
  const DType dtype = promote_types(x_in.dtype(), w_in.dtype());
  if (dtype != DType::Float32 && dtype != DType::BFloat16)
    fail<DTypeError>("quantized_matmul: operands {} and {} (expected float32 or bfloat16)", name(x_in.dtype()),
                     name(w_in.dtype()));
  const Array x = astype(x_in, dtype), w = astype(w_in, dtype);
  const int64_t k = x.shape(-1), wk = w.shape(options.transpose_w ? 1 : 0);
  if (wk != k)
    fail<ShapeError>("quantized_matmul: shapes {} and {}{} are not aligned: K={} vs {}", to_string(x.shape()),
                     to_string(w.shape()), options.transpose_w ? " (transposed)" : "", k, wk);
  QuantizedMatmulConfig config;
  config.trans_b = options.transpose_w;
  config.int8_backward = options.int8_backward;
  config.salt = options.salt;
  if (x.ndim() == 1) {
    const Array y = quantized_matmul_op(reshape(x, {1, k}), w, config, options.key ? &*options.key : nullptr);
    return reshape(y, {y.shape(1)});
  }
  return quantized_matmul_op(x, w, config, options.key ? &*options.key : nullptr);
}

Array matmul(const Array& a_in, const Array& b_in) {
  if (a_in.ndim() == 0 || b_in.ndim() == 0)
    fail<ShapeError>("matmul: scalar operands are not allowed (got {} and {}); use multiply", to_string(a_in.shape()),
                     to_string(b_in.shape()));
  DType dtype = promote_types(a_in.dtype(), b_in.dtype());
  check_matmul_dtype(dtype);
  Array a = astype(a_in, dtype), b = astype(b_in, dtype);
  const bool vec_a = a.ndim() == 1, vec_b = b.ndim() == 1;
  if (vec_a) a = reshape(a, {1, a.shape(0)});
  if (vec_b) b = reshape(b, {b.shape(0), 1});
  if (a.shape(-1) != b.shape(-2))
    fail<ShapeError>("matmul: shapes {} and {} are not aligned: {} (dim {}) != {} (dim {})", to_string(a_in.shape()),
                     to_string(b_in.shape()), a.shape(-1), a.ndim() - 1, b.shape(-2), b.ndim() - 2);
  if (a.ndim() > 2 && b.ndim() > 2 && batch_of(a) != batch_of(b)) {
    Shape batch = broadcast_shapes(batch_of(a), batch_of(b), "matmul");
    Shape sa = batch, sb = batch;
    sa.insert(sa.end(), {a.shape(-2), a.shape(-1)});
    sb.insert(sb.end(), {b.shape(-2), b.shape(-1)});
    a = broadcast_to(a, sa);
    b = broadcast_to(b, sb);
  }
  Array out = matmul_op(a, b, false, false);
  if (vec_a) out = squeeze(out, {-2});
  if (vec_b) out = squeeze(out, {-1});
  return out;
}

Array dot_general(const Array& a, const Array& b, const std::vector<int>& a_contract,
                  const std::vector<int>& b_contract, const std::vector<int>& a_batch,
                  const std::vector<int>& b_batch) {
  if (a_contract.size() != b_contract.size() || a_batch.size() != b_batch.size())
    fail<ShapeError>("dot_general: {} contracting / {} batch dims of a vs {} / {} of b (expected equal counts)",
                     a_contract.size(), a_batch.size(), b_contract.size(), b_batch.size());
  auto norm = [](const std::vector<int>& axes, const Array& x) {
    std::vector<int> out;
    for (int ax : axes) out.push_back(normalize_axis(ax, x.ndim(), "dot_general"));
    return out;
  };
  std::vector<int> ac = norm(a_contract, a), bc = norm(b_contract, b), ab = norm(a_batch, a), bb = norm(b_batch, b);
  for (size_t i = 0; i < ac.size(); ++i)
    if (a.shape()[ac[i]] != b.shape()[bc[i]])
      fail<ShapeError>("dot_general: contracting dim {} of {} has size {} but dim {} of {} has size {}", ac[i],
                       to_string(a.shape()), a.shape()[ac[i]], bc[i], to_string(b.shape()), b.shape()[bc[i]]);
  for (size_t i = 0; i < ab.size(); ++i)
    if (a.shape()[ab[i]] != b.shape()[bb[i]])
      fail<ShapeError>("dot_general: batch dim {} of {} has size {} but dim {} of {} has size {}", ab[i],
                       to_string(a.shape()), a.shape()[ab[i]], bb[i], to_string(b.shape()), b.shape()[bb[i]]);
  auto free_dims = [](const Array& x, const std::vector<int>& c, const std::vector<int>& bt) {
    std::vector<int> out;
    for (int i = 0; i < x.ndim(); ++i)
      if (std::find(c.begin(), c.end(), i) == c.end() && std::find(bt.begin(), bt.end(), i) == bt.end())
        out.push_back(i);
    return out;
  };
  std::vector<int> af = free_dims(a, ac, ab), bf = free_dims(b, bc, bb);
  auto prod = [](const Array& x, const std::vector<int>& dims) {
    int64_t p = 1;
    for (int d : dims) p *= x.shape()[d];
    return p;
  };
  int64_t batch = prod(a, ab), m = prod(a, af), k = prod(a, ac), n = prod(b, bf);
  std::vector<int> pa = ab, pb = bb;
  pa.insert(pa.end(), af.begin(), af.end());
  pa.insert(pa.end(), ac.begin(), ac.end());
  pb.insert(pb.end(), bc.begin(), bc.end());
  pb.insert(pb.end(), bf.begin(), bf.end());
  DType dtype = promote_types(a.dtype(), b.dtype());
  Array a3 = reshape(transpose(astype(a, dtype), pa), {batch, m, k});
  Array b3 = reshape(transpose(astype(b, dtype), pb), {batch, k, n});
  Array out = matmul_op(a3, b3, false, false);
  Shape shape;
  for (int d : ab) shape.push_back(a.shape()[d]);
  for (int d : af) shape.push_back(a.shape()[d]);
  for (int d : bf) shape.push_back(b.shape()[d]);
  return reshape(out, shape);
}

}  // namespace tessera
