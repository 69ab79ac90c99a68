// vjp, batching and composite rules of the fused NN primitives.
#include "tessera/ir/primitives/nn.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/primitives/rule_utils.h"
#include "tessera/core/ops.h"

namespace tessera {

// The visible (query, key) pairs of causal attention, top-left aligned.
double attention_visible_pairs(int64_t t, int64_t s, bool causal) {
  if (!causal) return static_cast<double>(t) * static_cast<double>(s);
  double total = 0;
  int64_t full_rows = std::max<int64_t>(0, t - s);  // rows t >= s see every key
  int64_t partial = t - full_rows;                  // rows 0..partial-1 see t+1 keys
  total += static_cast<double>(partial) * static_cast<double>(partial + 1) / 2.0;
  total += static_cast<double>(full_rows) * static_cast<double>(s);
  return total;
}

namespace {

Array last_axis_mean(const Array& x) { return mean(x, {-1}, true); }

// k/v [B, Hkv, S, D] repeated to [B, H, S, D] for grouped-query attention.
Array repeat_kv(const Array& x, int64_t heads) {
  int64_t hkv = x.shape(1);
  if (hkv == heads) return x;
  Array e = expand_dims(x, 2);
  Shape s = e.shape();
  s[2] = heads / hkv;
  return reshape(broadcast_to(e, s), {x.shape(0), heads, x.shape(2), x.shape(3)});
}

// Sums a [B, H, S, D] gradient over the query heads of each kv group.
Array reduce_kv(const Array& g, int64_t kv_heads) {
  int64_t h = g.shape(1);
  if (h == kv_heads) return g;
  return sum(reshape(g, {g.shape(0), kv_heads, h / kv_heads, g.shape(2), g.shape(3)}), {2});
}

// Visibility [.., T, S] (bool) from causality, the optional mask and the optional
// segment ids ([B, T]: same document, broadcast over heads as [B, 1, T, S]).
Array attention_visibility(const AttentionConfig& c, int64_t t, int64_t s, const std::vector<Array>& in) {
  Array vis = ones({t, s}, DType::Bool);
  if (c.causal) vis = less_equal(reshape(arange(s), {1, s}), reshape(arange(t), {t, 1}));
  if (c.has_mask) vis = logical_and(vis, in[c.mask_index()]);
  if (c.has_segments) {
    const Array& seg = in[c.segments_index()];
    const int64_t b = seg.shape(0);
    vis = logical_and(vis, equal(reshape(seg, {b, 1, t, 1}), reshape(seg, {b, 1, 1, s})));
  }
  return vis;
}

// vmap of row-batched primitives: the vmapped batch (moved to the front, or
// broadcast when the input is shared) is folded into dim 0, [n, d0, ...] -> [n*d0, ...].
Array fold_batch(const Array& x, int axis, int64_t n) {
  Array b = rules::batched_or_broadcast(x, axis, n);
  Shape s(b.shape().begin() + 1, b.shape().end());
  s[0] *= n;
  return reshape(b, s);
}

Array unfold_batch(const Array& y, int64_t n) {
  Shape s = y.shape();
  s[0] /= n;
  s.insert(s.begin(), n);
  return reshape(y, s);
}

// The attention mask [mb, mh, T, S] (mb, mh: 1 or full) folded like q: broadcast to the
// attention batch, then merged with the vmapped batch.
Array fold_mask(const Array& mask, int axis, int64_t n, int64_t attention_batch) {
  Array b = rules::batched_or_broadcast(mask, axis, n);  // [n, mb, mh, T, S]
  Shape s = b.shape();
  s[1] = attention_batch;
  b = broadcast_to(b, s);
  return reshape(b, {n * attention_batch, s[2], s[3], s[4]});
}

}  // namespace

// ---- softmax ----

std::vector<Array> Softmax::composite(const std::vector<Array>& in) const {
  const Array& x = in[0];
  Array lse = logsumexp(x, {-1}, true);
  return {log_ ? x - lse : exp(x - lse)};
}

std::vector<Array> Softmax::vjp(const std::vector<Array>&, const std::vector<Array>& cotangents,
                                const std::vector<int>&, const std::vector<Array>& outputs) {
  const Array& y = outputs[0];
  return {Array::make(y.shape(), y.dtype(), std::make_shared<SoftmaxGrad>(log_), {y, cotangents[0]})};
}

std::pair<std::vector<Array>, std::vector<int>> Softmax::vmap(const std::vector<Array>& inputs,
                                                              const std::vector<int>& axes) {
  Array x = inputs[0];
  int axis = axes[0];
  if (axis == x.ndim() - 1) {
    x = moveaxis(x, axis, 0);
    axis = 0;
  }
  return {{Array::make(x.shape(), x.dtype(), std::make_shared<Softmax>(log_), {x})}, {axis}};
}

Cost Softmax::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = 4.0 * static_cast<double>(inputs[0].size());
  return c;
}

std::vector<Array> SoftmaxGrad::composite(const std::vector<Array>& in) const {
  const Array& y = in[0];
  const Array& g = in[1];
  if (log_) return {g - exp(y) * sum(g, {-1}, true)};
  return {y * (g - sum(g * y, {-1}, true))};
}

std::pair<std::vector<Array>, std::vector<int>> SoftmaxGrad::vmap(const std::vector<Array>& inputs,
                                                                  const std::vector<int>& axes) {
  int64_t n = rules::batch_size(inputs, axes, name().c_str());
  Array y = rules::batched_or_broadcast(inputs[0], axes[0], n);
  Array g = rules::batched_or_broadcast(inputs[1], axes[1], n);
  return {{Array::make(y.shape(), y.dtype(), std::make_shared<SoftmaxGrad>(log_), {y, g})}, {0}};
}

// ---- layer norm / rms norm ----

std::string Norm::attributes() const { return fmt::format("eps={}, weight={}, bias={}", eps_, has_weight_, has_bias_); }

std::vector<Array> Norm::composite(const std::vector<Array>& in) const {
  const Array& x = in[0];
  DType acc = accumulation_dtype(x.dtype());
  Array xa = astype(x, acc);
  size_t next = 1;
  std::vector<Array> outs;
  Array y, mu, rstd;
  if (rms_) {
    rstd = rsqrt(last_axis_mean(square(xa)) + eps_);
    y = xa * rstd;
  } else {
    mu = last_axis_mean(xa);
    Array centered = xa - mu;
    rstd = rsqrt(last_axis_mean(square(centered)) + eps_);
    y = centered * rstd;
  }
  if (has_weight_) y = y * astype(in[next++], acc);
  if (has_bias_) y = y + astype(in[next++], acc);
  outs.push_back(astype(y, x.dtype()));
  if (!rms_) outs.push_back(squeeze(mu, {-1}));
  outs.push_back(squeeze(rstd, {-1}));
  return outs;
}

std::vector<Array> Norm::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<Array>& outputs) {
  const Array& x = primals[0];
  const Array& mu = rms_ ? Array() : outputs[1];
  const Array& rstd = outputs.back();
  std::vector<Array> grad_inputs{x};
  if (has_weight_) grad_inputs.push_back(primals[1]);
  if (!rms_) grad_inputs.push_back(mu);
  grad_inputs.push_back(rstd);
  grad_inputs.push_back(cotangents[0].valid() ? cotangents[0] : zeros_like(outputs[0]));
  std::vector<Shape> shapes{x.shape()};
  std::vector<DType> dtypes{x.dtype()};
  for (bool has : {has_weight_, has_bias_ && !rms_}) {
    if (!has) continue;
    shapes.push_back({x.shape(-1)});
    dtypes.push_back(x.dtype());
  }
  std::vector<Array> grads =
      Array::make(shapes, dtypes, std::make_shared<NormGrad>(rms_, has_weight_, has_bias_ && !rms_), grad_inputs);
  // Gradients that reach the saved statistics (only in higher-order use):
  // d mean/dx = 1/n, d rstd/dx = -rstd^3 (x - mean) / n  (rms: -rstd^3 x / n).
  const Array& ct_mu = rms_ ? Array() : cotangents[1];
  const Array& ct_rstd = cotangents.back();
  if (ct_mu.valid() || ct_rstd.valid()) {
    DType acc = accumulation_dtype(x.dtype());
    double n = static_cast<double>(x.shape(-1));
    Array xa = astype(x, acc);
    Array extra = zeros({}, acc);
    if (ct_mu.valid()) extra = extra + expand_dims(ct_mu, -1) * (1.0 / n);
    if (ct_rstd.valid()) {
      Array r = expand_dims(rstd, -1);
      Array centered = rms_ ? xa : xa - expand_dims(mu, -1);
      extra = extra + expand_dims(ct_rstd, -1) * r * r * r * centered * (-1.0 / n);
    }
    grads[0] = grads[0] + astype(extra, x.dtype());
  }
  std::vector<Array> result;
  for (int arg : argnums) result.push_back(grads[arg]);
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> Norm::vmap(const std::vector<Array>& inputs,
                                                           const std::vector<int>& axes) {
  bool params_batched = false;
  for (size_t i = 1; i < axes.size(); ++i) params_batched = params_batched || axes[i] >= 0;
  bool rms = rms_, has_w = has_weight_, has_b = has_bias_;
  double eps = eps_;
  auto apply = [rms, has_w, has_b, eps](const std::vector<Array>& in) {
    std::optional<Array> w, b;
    size_t next = 1;
    if (has_w) w = in[next++];
    if (has_b) b = in[next++];
    Array y = rms ? rms_norm(in[0], w, eps) : layer_norm(in[0], w, b, eps);
    return y.siblings();
  };
  if (params_batched) return rules::loop_vmap(apply, inputs, axes, name().c_str());
  std::vector<Array> in = inputs;
  in[0] = rules::batch_to_front(inputs[0], axes[0]);
  if (in[0].ndim() == 1) fail<ShapeError>("vmap ({}): the batch axis cannot be the normalized axis", name());
  return {apply(in), std::vector<int>(rms_ ? 2 : 3, 0)};
}

Cost Norm::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = 8.0 * static_cast<double>(inputs[0].size());
  return c;
}

std::string NormGrad::attributes() const { return fmt::format("weight={}, bias={}", has_weight_, has_bias_); }

std::vector<Array> NormGrad::composite(const std::vector<Array>& in) const {
  size_t next = 0;
  const Array& x = in[next++];
  std::optional<Array> w;
  if (has_weight_) w = in[next++];
  std::optional<Array> mu;
  if (!rms_) mu = in[next++];
  const Array& rstd_in = in[next++];
  const Array& dy = in[next++];
  DType acc = accumulation_dtype(x.dtype());
  Array xa = astype(x, acc), dya = astype(dy, acc);
  Array rstd = expand_dims(rstd_in, -1);
  Array xhat = rms_ ? xa * rstd : (xa - expand_dims(*mu, -1)) * rstd;
  Array gw = w ? dya * astype(*w, acc) : dya;
  Array dx = rms_ ? rstd * (gw - xhat * last_axis_mean(gw * xhat))
                  : rstd * (gw - last_axis_mean(gw) - xhat * last_axis_mean(gw * xhat));
  std::vector<int> rows;
  for (int i = 0; i < x.ndim() - 1; ++i) rows.push_back(i);
  std::vector<Array> outs{astype(dx, x.dtype())};
  if (has_weight_) outs.push_back(astype(rows.empty() ? dya * xhat : sum(dya * xhat, rows), x.dtype()));
  if (has_bias_) outs.push_back(astype(rows.empty() ? dya : sum(dya, rows), x.dtype()));
  return outs;
}

// ---- attention ----

namespace {
// "segments" only when set, so programs without packing keep their text (and their
// compilation-cache keys).
std::string attention_attributes(const AttentionConfig& c) {
  std::string text = fmt::format("causal={}, scale={}, mask={}", c.causal, c.scale, c.has_mask);
  if (c.has_segments) text += ", segments=true";
  return text;
}
}  // namespace

std::string Attention::attributes() const { return attention_attributes(config_); }
std::string AttentionGrad::attributes() const { return attention_attributes(config_); }

std::vector<Array> Attention::composite(const std::vector<Array>& in) const {
  const Array& q = in[0];
  int64_t h = q.shape(1), t = q.shape(2), s = in[1].shape(2);
  DType acc = accumulation_dtype(q.dtype());
  Array k = astype(repeat_kv(in[1], h), acc), v = astype(repeat_kv(in[2], h), acc);
  Array scores = matmul(astype(q, acc), swapaxes(k, -1, -2)) * config_.scale;
  Array vis = attention_visibility(config_, t, s, in);
  Array neg_inf = full({}, -std::numeric_limits<double>::infinity(), acc);
  Array masked = where(vis, scores, neg_inf);
  Array lse = logsumexp(masked, {-1}, true);
  Array safe_lse = where(equal(lse, neg_inf), zeros({}, acc), lse);
  Array p = where(vis, exp(masked - safe_lse), zeros({}, acc));
  return {astype(matmul(p, v), q.dtype()), squeeze(lse, {-1})};
}

std::vector<Array> Attention::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                  const std::vector<int>& argnums, const std::vector<Array>& outputs) {
  if (cotangents[1].valid()) return Primitive::vjp(primals, cotangents, argnums, outputs);  // gradient into lse
  std::vector<Array> in = primals;
  in.push_back(outputs[0]);
  in.push_back(outputs[1]);
  in.push_back(cotangents[0]);
  auto grads = Array::make({primals[0].shape(), primals[1].shape(), primals[2].shape()},
                           {primals[0].dtype(), primals[1].dtype(), primals[2].dtype()},
                           std::make_shared<AttentionGrad>(config_), in);
  std::vector<Array> result;
  for (int arg : argnums) result.push_back(arg < 3 ? grads[arg] : zeros_like(primals[arg]));
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> Attention::vmap(const std::vector<Array>& inputs,
                                                                const std::vector<int>& axes) {
  AttentionConfig config = config_;
  auto apply = [config](const std::vector<Array>& in) {
    std::optional<Array> mask, segments;
    if (config.has_mask) mask = in[config.mask_index()];
    if (config.has_segments) segments = in[config.segments_index()];
    return scaled_dot_product_attention(in[0], in[1], in[2], config.causal, mask, config.scale, segments).siblings();
  };
  // Fold the vmapped batch into the attention batch: [n, B, ...] -> [n*B, ...]; the
  // segment ids [B, T] fold like q.
  int64_t n = rules::batch_size(inputs, axes, "attention");
  std::vector<Array> folded;
  for (int i = 0; i < 3; ++i) folded.push_back(fold_batch(inputs[i], axes[i], n));
  if (config_.has_mask) folded.push_back(fold_mask(inputs[3], axes[3], n, folded[0].shape(0) / n));
  if (config_.has_segments) {
    const size_t i = config_.segments_index();
    folded.push_back(fold_batch(inputs[i], axes[i], n));
  }
  std::vector<Array> outs = apply(folded);
  return {{unfold_batch(outs[0], n), unfold_batch(outs[1], n)}, {0, 0}};
}

std::pair<std::vector<Array>, std::vector<int>> AttentionGrad::vmap(const std::vector<Array>& inputs,
                                                                    const std::vector<int>& axes) {
  int64_t n = rules::batch_size(inputs, axes, "attention_grad");
  size_t mask_index = config_.has_mask ? 3 : inputs.size();
  std::vector<Array> folded;
  for (size_t i = 0; i < inputs.size(); ++i)
    folded.push_back(i == mask_index ? Array() : fold_batch(inputs[i], axes[i], n));
  if (config_.has_mask) folded[mask_index] = fold_mask(inputs[mask_index], axes[mask_index], n, folded[0].shape(0) / n);
  auto grads = Array::make({folded[0].shape(), folded[1].shape(), folded[2].shape()},
                           {folded[0].dtype(), folded[1].dtype(), folded[2].dtype()},
                           std::make_shared<AttentionGrad>(config_), folded);
  return {{unfold_batch(grads[0], n), unfold_batch(grads[1], n), unfold_batch(grads[2], n)}, {0, 0, 0}};
}

Cost Attention::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  const Array& q = inputs[0];
  double pairs = attention_visible_pairs(q.shape(2), inputs[1].shape(2), config_.causal);
  Cost c = Primitive::cost(inputs, outputs);
  // QK^T and PV: 2 matmuls of 2*D flops per visible pair, per (batch, head). With
  // segment ids the visible pairs depend on the data: the causal count is a bound.
  c.flops = 4.0 * static_cast<double>(q.shape(0) * q.shape(1)) * pairs * static_cast<double>(q.shape(3));
  return c;
}

std::vector<Array> AttentionGrad::composite(const std::vector<Array>& in) const {
  const size_t m = config_.optional_inputs();
  const Array &q = in[0], &k_in = in[1], &v_in = in[2];
  const Array &out = in[3 + m], &lse_in = in[4 + m], &dout = in[5 + m];
  int64_t h = q.shape(1), hkv = k_in.shape(1), t = q.shape(2), s = k_in.shape(2);
  DType acc = accumulation_dtype(q.dtype());
  Array qa = astype(q, acc), k = astype(repeat_kv(k_in, h), acc), v = astype(repeat_kv(v_in, h), acc);
  Array doa = astype(dout, acc);
  Array vis = attention_visibility(config_, t, s, in);
  Array lse = expand_dims(lse_in, -1);
  Array neg_inf = full({}, -std::numeric_limits<double>::infinity(), acc);
  Array safe_lse = where(equal(lse, neg_inf), zeros({}, acc), lse);
  Array scores = matmul(qa, swapaxes(k, -1, -2)) * config_.scale;
  Array p = where(vis, exp(scores - safe_lse), zeros({}, acc));
  Array dv = matmul(swapaxes(p, -1, -2), doa);
  Array dp = matmul(doa, swapaxes(v, -1, -2));
  Array delta = sum(doa * astype(out, acc), {-1}, true);
  Array ds = p * (dp - delta) * config_.scale;
  Array dq = matmul(ds, k);
  Array dk = matmul(swapaxes(ds, -1, -2), qa);
  return {astype(dq, q.dtype()), astype(reduce_kv(dk, hkv), k_in.dtype()), astype(reduce_kv(dv, hkv), v_in.dtype())};
}

Cost AttentionGrad::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  const Array& q = inputs[0];
  double pairs = attention_visible_pairs(q.shape(2), inputs[1].shape(2), config_.causal);
  Cost c = Primitive::cost(inputs, outputs);
  // Recompute QK^T, then dV, dP, dQ, dK: 5 matmuls (flash-attention-2 backward).
  c.flops = 10.0 * static_cast<double>(q.shape(0) * q.shape(1)) * pairs * static_cast<double>(q.shape(3));
  return c;
}

// ---- cross-entropy ----

namespace {
// "classes" only when set, so programs without vocabulary padding keep their text (and
// their compilation-cache keys).
std::string cross_entropy_attributes(int64_t ignore_index, int64_t classes) {
  if (classes > 0) return fmt::format("ignore_index={}, classes={}", ignore_index, classes);
  return fmt::format("ignore_index={}", ignore_index);
}
}  // namespace

std::string CrossEntropy::attributes() const { return cross_entropy_attributes(ignore_index_, classes_); }
std::string CrossEntropyGrad::attributes() const { return cross_entropy_attributes(ignore_index_, classes_); }
std::string CrossEntropyWithGrad::attributes() const { return cross_entropy_attributes(ignore_index_, classes_); }

namespace {
struct SafeTargets {
  Array valid;    // bool [N]
  Array targets;  // int64 [N], ignored rows pointed at class 0
};
SafeTargets safe_targets(const Array& targets, int64_t ignore_index) {
  Array valid = not_equal(targets, full({}, static_cast<double>(ignore_index), DType::Int64));
  return {valid, where(valid, targets, zeros({}, DType::Int64))};
}
}  // namespace

std::vector<Array> CrossEntropy::composite(const std::vector<Array>& in) const {
  Array logits = astype(in[0], accumulation_dtype(in[0].dtype()));
  if (classes_ > 0) logits = slice_axis(logits, -1, 0, classes_);
  SafeTargets t = safe_targets(in[1], ignore_index_);
  Array lse = logsumexp(logits, {-1});
  Array picked = squeeze(take_along_axis(logits, expand_dims(t.targets, -1), -1), {-1});
  return {where(t.valid, lse - picked, zeros({}, logits.dtype())), lse};
}

std::vector<Array> CrossEntropy::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                     const std::vector<int>& argnums, const std::vector<Array>& outputs) {
  if (cotangents[1].valid()) return Primitive::vjp(primals, cotangents, argnums, outputs);
  std::vector<Array> result;
  for (int arg : argnums) {
    if (arg == 1) {
      result.push_back(zeros_like(primals[1]));
      continue;
    }
    result.push_back(Array::make(primals[0].shape(), primals[0].dtype(),
                                 std::make_shared<CrossEntropyGrad>(ignore_index_, classes_),
                                 {primals[0], primals[1], outputs[1], cotangents[0]}));
  }
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> CrossEntropy::vmap(const std::vector<Array>& inputs,
                                                                   const std::vector<int>& axes) {
  int64_t n = rules::batch_size(inputs, axes, "cross_entropy");
  Array logits = fold_batch(inputs[0], axes[0], n), targets = fold_batch(inputs[1], axes[1], n);
  DType acc = accumulation_dtype(logits.dtype());
  auto outs = Array::make({targets.shape(), targets.shape()}, {acc, acc},
                          std::make_shared<CrossEntropy>(ignore_index_, classes_), {logits, targets});
  return {{unfold_batch(outs[0], n), unfold_batch(outs[1], n)}, {0, 0}};
}

Cost CrossEntropy::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = 3.0 * static_cast<double>(inputs[0].size());
  return c;
}

std::pair<std::vector<Array>, std::vector<int>> CrossEntropyGrad::vmap(const std::vector<Array>& inputs,
                                                                       const std::vector<int>& axes) {
  int64_t n = rules::batch_size(inputs, axes, "cross_entropy_grad");
  std::vector<Array> folded;
  for (size_t i = 0; i < inputs.size(); ++i) folded.push_back(fold_batch(inputs[i], axes[i], n));
  Array dlogits = Array::make(folded[0].shape(), folded[0].dtype(),
                              std::make_shared<CrossEntropyGrad>(ignore_index_, classes_), folded);
  return {{unfold_batch(dlogits, n)}, {0}};
}

std::vector<Array> CrossEntropyGrad::composite(const std::vector<Array>& in) const {
  DType acc = accumulation_dtype(in[0].dtype());
  Array logits = astype(in[0], acc);
  const int64_t row = logits.shape(-1), classes = classes_in(row);
  if (classes < row) logits = slice_axis(logits, -1, 0, classes);
  SafeTargets t = safe_targets(in[1], ignore_index_);
  Array p = exp(logits - expand_dims(in[2], -1));
  Array onehot = one_hot(t.targets, classes, acc);
  Array scale = where(t.valid, in[3], zeros({}, acc));
  Array dlogits = (p - onehot) * expand_dims(scale, -1);
  if (classes < row) dlogits = concatenate({dlogits, zeros({logits.shape(0), row - classes}, acc)}, -1);
  return {astype(dlogits, in[0].dtype())};
}

std::vector<Array> CrossEntropyWithGrad::composite(const std::vector<Array>& in) const {
  std::vector<Array> out = CrossEntropy(ignore_index_, classes_).composite({in[0], in[1]});
  out.push_back(CrossEntropyGrad(ignore_index_, classes_).composite({in[0], in[1], out[1], in[2]})[0]);
  return out;
}

}  // namespace tessera
