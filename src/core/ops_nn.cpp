// Neural-network ops on the fused primitives: validation and layout only.
#include <cmath>

#include "tessera/core/ops.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera {
namespace {

void require_floating(const Array& a, const char* op, const char* what = "input") {
  if (!is_floating(a.dtype()))
    fail<DTypeError>("{}: {} has dtype {} (expected a floating dtype: float32, float64, bfloat16 or float16)", op, what,
                     name(a.dtype()));
}

Array softmax_impl(const Array& a, int axis_in, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  require_floating(a, op);
  if (a.ndim() == 0) fail<ShapeError>("{}: needs at least one axis (got a scalar)", op);
  int axis = normalize_axis(axis_in, a.ndim(), op);
  Array x = axis == a.ndim() - 1 ? a : moveaxis(a, axis, -1);
  Array y = Array::make(x.shape(), x.dtype(), std::make_shared<Softmax>(log), {x});
  return axis == a.ndim() - 1 ? y : moveaxis(y, -1, axis);
}

Shape leading(const Shape& s) { return Shape(s.begin(), s.end() - 1); }

Array norm_impl(bool rms, const Array& x, const std::optional<Array>& weight, const std::optional<Array>& bias,
                double eps) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  require_floating(x, op);
  if (x.ndim() == 0) fail<ShapeError>("{}: needs at least one axis (got a scalar)", op);
  if (!(eps >= 0)) fail<ValueError>("{}: eps {} must be >= 0", op, eps);
  int64_t d = x.shape(-1);
  std::vector<Array> inputs{x};
  for (const auto* param : {&weight, &bias}) {
    if (!param->has_value()) continue;
    const Array& p = **param;
    if (p.shape() != Shape{d})
      fail<ShapeError>("{}: {} has shape {} but x has shape {} (expected [{}])", op,
                       param == &weight ? "weight" : "bias", to_string(p.shape()), to_string(x.shape()), d);
    inputs.push_back(astype(p, x.dtype()));
  }
  DType acc = accumulation_dtype(x.dtype());
  std::vector<Shape> shapes{x.shape()};
  std::vector<DType> dtypes{x.dtype()};
  if (!rms) {
    shapes.push_back(leading(x.shape()));
    dtypes.push_back(acc);
  }
  shapes.push_back(leading(x.shape()));
  dtypes.push_back(acc);
  auto prim = std::make_shared<Norm>(rms, weight.has_value(), bias.has_value(), eps);
  return Array::make(shapes, dtypes, prim, inputs)[0];
}

}  // namespace

Array softmax(const Array& a, int axis) { return softmax_impl(a, axis, false); }
Array log_softmax(const Array& a, int axis) { return softmax_impl(a, axis, true); }

Array layer_norm(const Array& x, const std::optional<Array>& weight, const std::optional<Array>& bias, double eps) {
  return norm_impl(false, x, weight, bias, eps);
}

Array rms_norm(const Array& x, const std::optional<Array>& weight, double eps) {
  return norm_impl(true, x, weight, std::nullopt, eps);
}

Array scaled_dot_product_attention(const Array& q_in, const Array& k_in, const Array& v_in, bool causal,
                                   const std::optional<Array>& mask, std::optional<double> scale,
                                   const std::optional<Array>& segment_ids) {
  const char* op = "scaled_dot_product_attention";
  for (const Array* a : {&q_in, &k_in, &v_in}) {
    require_floating(*a, op, a == &q_in ? "q" : a == &k_in ? "k" : "v");
    if (a->ndim() != 4)
      fail<ShapeError>("{}: q, k, v must be [batch, heads, seq, head_dim]; got q {}, k {}, v {}", op,
                       to_string(q_in.shape()), to_string(k_in.shape()), to_string(v_in.shape()));
  }
  DType dtype = promote_types(promote_types(q_in.dtype(), k_in.dtype()), v_in.dtype());
  Array q = astype(q_in, dtype), k = astype(k_in, dtype), v = astype(v_in, dtype);
  int64_t b = q.shape(0), h = q.shape(1), t = q.shape(2), d = q.shape(3);
  int64_t hkv = k.shape(1), s = k.shape(2);
  if (k.shape() != v.shape() || k.shape(0) != b || k.shape(3) != d || hkv == 0 || h % hkv != 0)
    fail<ShapeError>(
        "{}: incompatible shapes q {}, k {}, v {} (expected k == v == [{}, Hkv, S, {}] with {} heads a "
        "multiple of Hkv)",
        op, to_string(q.shape()), to_string(k.shape()), to_string(v.shape()), b, d, h);
  AttentionConfig config;
  config.causal = causal;
  config.scale = scale.value_or(d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0);
  std::vector<Array> inputs{q, k, v};
  if (mask) {
    Array m = mask->dtype() == DType::Bool ? *mask : astype(*mask, DType::Bool);
    if (m.ndim() > 4)
      fail<ShapeError>("{}: mask of shape {} has rank > 4 (expected broadcastable to [{}, {}, {}, {}])", op,
                       to_string(m.shape()), b, h, t, s);
    Shape full{b, h, t, s};
    broadcast_shapes(m.shape(), full, op);  // validates
    Shape padded(4 - m.ndim(), 1);
    padded.insert(padded.end(), m.shape().begin(), m.shape().end());
    if (broadcast_shapes(padded, full, op) != full)
      fail<ShapeError>("{}: mask of shape {} does not broadcast to [{}, {}, {}, {}]", op, to_string(m.shape()), b, h, t,
                       s);
    // The kernel reads [T, S] planes with batch/head strides: keep size-1 batch/head dims.
    Shape target{padded[0], padded[1], t, s};
    inputs.push_back(broadcast_to(reshape(m, padded), target));
    config.has_mask = true;
  }
  if (segment_ids) {
    if (!is_integral(segment_ids->dtype()))
      fail<DTypeError>("{}: segment_ids have dtype {} (expected integer document ids)", op, name(segment_ids->dtype()));
    if (segment_ids->shape() != Shape{b, t})
      fail<ShapeError>("{}: segment_ids of shape {} (expected [batch {}, seq {}] for q {})", op,
                       to_string(segment_ids->shape()), b, t, to_string(q.shape()));
    if (s != t)
      fail<ValueError>(
          "{}: segment_ids need self-attention over one packed row (T == S), but q {} has T = {} and k {} has S = {} "
          "(a KV cache)",
          op, to_string(q.shape()), t, to_string(k.shape()), s);
    inputs.push_back(astype(*segment_ids, DType::Int32));
    config.has_segments = true;
  }
  auto prim = std::make_shared<Attention>(config);
  return Array::make({q.shape(), Shape{b, h, t}}, {dtype, accumulation_dtype(dtype)}, prim, inputs)[0];
}

Array cross_entropy(const Array& logits, const Array& targets, int64_t ignore_index, Reduction reduction,
                    int64_t classes) {
  const char* op = "cross_entropy";
  require_floating(logits, op, "logits");
  if (!is_integral(targets.dtype()))
    fail<DTypeError>("{}: targets have dtype {} (expected integer class indices)", op, name(targets.dtype()));
  if (logits.ndim() < 1 || leading(logits.shape()) != targets.shape())
    fail<ShapeError>("{}: logits {} and targets {} do not match (expected targets of shape logits.shape[:-1])", op,
                     to_string(logits.shape()), to_string(targets.shape()));
  int64_t vocab = logits.shape(-1);
  if (classes < 0 || classes > vocab)
    fail<ValueError>("{}: classes = {} is outside [0, {}] (the logits' last dimension; 0: all)", op, classes, vocab);
  if (classes == vocab) classes = 0;
  Array flat_logits = reshape(logits, {-1, vocab});
  if (vocab == 0) flat_logits = reshape(logits, {targets.size(), 0});
  Array flat_targets = reshape(astype(targets, DType::Int64), {targets.size()});
  DType acc = accumulation_dtype(logits.dtype());
  int64_t n = targets.size();
  auto outs = Array::make({Shape{n}, Shape{n}}, {acc, acc}, std::make_shared<CrossEntropy>(ignore_index, classes),
                          {flat_logits, flat_targets});
  Array loss = outs[0];
  switch (reduction) {
    case Reduction::None:
      return reshape(loss, targets.shape());
    case Reduction::Sum:
      return sum(loss);
    case Reduction::Mean: {
      Array counted =
          sum(astype(not_equal(flat_targets, full({}, static_cast<double>(ignore_index), DType::Int64)), acc));
      return sum(loss) / maximum(counted, ones({}, acc));
    }
  }
  return loss;
}

}  // namespace tessera
