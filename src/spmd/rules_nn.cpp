// Sharding rules for the fused neural-network primitives. Each normalizes or
// attends over some dimensions; those must be whole on every device (they are
// gathered), every other dimension keeps its split:
//   softmax, layer/rms norm: the last dim; cross-entropy: the vocabulary
// (attention: rules_attention.cpp).
// Parameter gradients of a norm sum over the split rows: partial sums.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "spmd/rules.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/nn.h"
#include "tessera/spmd/collectives.h"

namespace tessera::spmd::rules {

namespace {

int last(const Sharding& s) { return s.rank() - 1; }

// The sharding of x's leading dims (x without its last dim).
Sharding leading(const Sharding& x) {
  Sharding s = Sharding::replicated(x.mesh(), x.rank() - 1);
  for (int d = 0; d + 1 < x.rank(); ++d) s = s.with_dim_axes(d, x.dim_axes(d));
  return s;
}

std::vector<int> split_axes(const Sharding& s) {
  std::vector<int> axes;
  for (int d = 0; d < s.rank(); ++d) axes.insert(axes.end(), s.dim_axes(d).begin(), s.dim_axes(d).end());
  return axes;
}

Decision softmax_rule(const Context& c) {
  // softmax(x) or softmax_grad(y, dy): every operand shaped like the output.
  std::vector<int> operands;
  for (size_t i = 0; i < c.in.size(); ++i) operands.push_back(static_cast<int>(i));
  Context whole = c;
  for (Sharding& s : whole.in) s = gathered(s, {last(s)});
  Sharding target = elementwise_target(whole, operands, false);
  Decision dec;
  dec.inputs.assign(c.in.size(), target);
  dec.outputs.assign(c.out_types.size(), target);
  return dec;
}

Decision norm_rule(const Context& c) {
  Sharding x = gathered(c.in[0], {last(c.in[0])});
  Decision dec;
  dec.inputs.push_back(x);
  for (size_t i = 1; i < c.in.size(); ++i) dec.inputs.push_back(Sharding::replicated(c.mesh, 1));
  dec.outputs.push_back(x);
  for (size_t o = 1; o < c.out_types.size(); ++o) dec.outputs.push_back(leading(x));
  return dec;
}

Decision norm_grad_rule(const Context& c) {
  const auto& p = static_cast<const NormGrad&>(c.primitive);
  // Inputs: x, [weight], [mean], rstd, dy.
  size_t i_weight = p.has_weight() ? 1 : 0;
  size_t i_dy = c.in.size() - 1;
  Context whole = c;
  for (Sharding& s : whole.in) s = gathered(s, {last(s)});
  Sharding x = elementwise_target(whole, {0, static_cast<int>(i_dy)}, false);
  Decision dec;
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (i == 0 || i == i_dy) {
      dec.inputs.push_back(x);
    } else if (p.has_weight() && i == i_weight) {
      dec.inputs.push_back(Sharding::replicated(c.mesh, 1));
    } else {
      dec.inputs.push_back(leading(x));  // mean, rstd
    }
  }
  dec.outputs.push_back(x);
  Sharding param_grad = Sharding::replicated(c.mesh, 1).with_partial(split_axes(x));
  for (size_t o = 1; o < c.out_types.size(); ++o) dec.outputs.push_back(param_grad);
  return dec;
}

// This device's vocabulary ids, [V / n]: a slice of arange(V) along the vocab axes.
Array local_vocab_ids(const Mesh& mesh, const std::vector<int>& axes, int64_t vocab) {
  return shard_slice(arange(vocab, DType::Int64), mesh, axes, 0);
}

// Vocabulary-parallel cross-entropy (Megatron): the logits stay split over the
// vocabulary; each device reduces its slice and three small collectives over the
// vocab axes finish the job: the row maxima (all-gather of [rows]), the sums of
// exponentials and the target logit (all-reduces of [rows]). The gradient needs no
// communication: softmax - onehot on the local slice, with the global lse.
// With a padded vocabulary (classes < vocab) the padding columns are -inf on every
// device, so they drop out of the maxima, the sums and the gradient.
Array mask_padding(const Array& logits, const Array& ids, int64_t classes, int64_t vocab) {
  if (classes >= vocab) return logits;
  Array real = expand_dims(less(ids, full({}, static_cast<double>(classes), DType::Int64)), 0);
  return where(real, logits, full({}, -std::numeric_limits<double>::infinity(), logits.dtype()));
}

std::vector<Array> vocab_parallel_loss(const std::vector<Array>& in, const Mesh& mesh, const std::vector<int>& axes,
                                       int64_t vocab, int64_t classes, int64_t ignore_index) {
  Array ids = local_vocab_ids(mesh, axes, vocab);
  Array raw = astype(in[0], accumulation_dtype(in[0].dtype()));
  Array logits = mask_padding(raw, ids, classes, vocab);
  Array targets = astype(in[1], DType::Int64);
  const int64_t rows = logits.shape(0);
  Array m_local = max(stop_gradient(logits), {-1});
  Array m = max(all_gather(reshape(m_local, {1, rows}), mesh, axes, 0), {0});
  Array sum_exp = all_reduce(sum(exp(logits - expand_dims(m, -1)), {-1}), mesh, axes);
  Array lse = m + log(sum_exp);
  Array onehot = astype(equal(expand_dims(targets, -1), expand_dims(ids, 0)), logits.dtype());
  // The target logit from the unmasked values (-inf * 0 would be NaN; no target is padding).
  Array picked = all_reduce(sum(raw * onehot, {-1}), mesh, axes);
  Array valid = not_equal(targets, full({}, static_cast<double>(ignore_index), DType::Int64));
  return {where(valid, lse - picked, zeros({}, logits.dtype())), lse};
}

std::vector<Array> vocab_parallel_grad(const std::vector<Array>& in, const Mesh& mesh, const std::vector<int>& axes,
                                       int64_t vocab, int64_t classes, int64_t ignore_index) {
  DType acc = accumulation_dtype(in[0].dtype());
  Array ids = local_vocab_ids(mesh, axes, vocab);
  Array logits = mask_padding(astype(in[0], acc), ids, classes, vocab);
  Array targets = astype(in[1], DType::Int64);
  Array p = exp(logits - expand_dims(in[2], -1));
  Array onehot = astype(equal(expand_dims(targets, -1), expand_dims(ids, 0)), acc);
  Array valid = not_equal(targets, full({}, static_cast<double>(ignore_index), DType::Int64));
  Array scale = where(valid, in[3], zeros({}, acc));
  return {astype((p - onehot) * expand_dims(scale, -1), in[0].dtype())};
}

Decision cross_entropy_rule(const Context& c) {
  // logits [N, V], targets [N] (grad: logits, targets, lse, dloss): rows follow the
  // logits (or the targets when the logits' rows are whole). A vocabulary split on
  // other axes stays (vocabulary-parallel); otherwise the vocabulary is gathered.
  std::vector<int> rows = c.in[0].dim_axes(0);
  if (rows.empty()) rows = c.in[1].dim_axes(0);
  std::vector<int> vocab_axes = c.in[0].dim_axes(1);
  for (int a : vocab_axes)
    if (std::find(rows.begin(), rows.end(), a) != rows.end()) vocab_axes.clear();
  const bool grad = c.out_types.size() == 1 && c.out_types[0].shape.size() == 2;
  Sharding logits = Sharding::replicated(c.mesh, 2).with_dim_axes(0, rows).with_dim_axes(1, vocab_axes);
  Sharding row = Sharding::replicated(c.mesh, 1).with_dim_axes(0, rows);
  Decision dec;
  dec.inputs.push_back(logits);
  for (size_t i = 1; i < c.in.size(); ++i) dec.inputs.push_back(row);
  if (grad) {
    dec.outputs = {logits};
  } else {
    dec.outputs.assign(c.out_types.size(), row);
  }
  if (!vocab_axes.empty()) {
    const Mesh mesh = c.mesh;
    const int64_t vocab = c.in_types[0].shape[1];
    const int64_t ignore = grad ? static_cast<const CrossEntropyGrad&>(c.primitive).ignore_index()
                                : static_cast<const CrossEntropy&>(c.primitive).ignore_index();
    const int64_t classes = grad ? static_cast<const CrossEntropyGrad&>(c.primitive).classes_in(vocab)
                                 : static_cast<const CrossEntropy&>(c.primitive).classes_in(vocab);
    dec.expand = [mesh, vocab_axes, vocab, classes, ignore, grad](const std::vector<Array>& in) {
      return grad ? vocab_parallel_grad(in, mesh, vocab_axes, vocab, classes, ignore)
                  : vocab_parallel_loss(in, mesh, vocab_axes, vocab, classes, ignore);
    };
  }
  return dec;
}

}  // namespace

void register_nn() {
  for (const char* name : {"softmax", "log_softmax", "softmax_grad", "log_softmax_grad"}) add(name, softmax_rule);
  add("layer_norm", norm_rule);
  add("rms_norm", norm_rule);
  add("layer_norm_grad", norm_grad_rule);
  add("rms_norm_grad", norm_grad_rule);
  add("cross_entropy", cross_entropy_rule);
  add("cross_entropy_grad", cross_entropy_rule);
}

}  // namespace tessera::spmd::rules
