// The rules of a custom op: each delegates to the user's definition, with the defaults
// a definition may leave out (vmap loops over the batch; grad without a vjp is an
// error naming the op; the cost counts one FLOP per output element).
#include "core/custom_op_primitive.h"
#include "core/primitives/rule_utils.h"
#include "tessera/core/ops.h"

namespace tessera {

std::vector<Array> CustomOp::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                 const std::vector<int>& argnums, const std::vector<Array>& outputs) {
  const CustomOpDefinition& d = *definition_;
  if (!d.vjp)
    fail<TransformError>(
        "grad: custom op '{}' has no vjp (give CustomOpDefinition::vjp, or wrap its inputs in stop_gradient())",
        d.name);
  std::vector<Array> grads = d.vjp(primals, rules::with_zero_cotangents(cotangents, outputs), outputs, attributes_);
  if (grads.size() != primals.size())
    fail<TransformError>("grad: the vjp of custom op '{}' returned {} cotangents (expected {}, one per input)", d.name,
                         grads.size(), primals.size());
  std::vector<Array> result;
  for (int i : argnums) {
    const Array& g = grads[static_cast<size_t>(i)];
    const Array& x = primals[static_cast<size_t>(i)];
    if (!g.valid()) {
      result.push_back(zeros_like(x));
      continue;
    }
    if (g.shape() != x.shape())
      fail<TransformError>("grad: the vjp of custom op '{}' gave input {} a cotangent of shape {} (expected {})",
                           d.name, i, to_string(g.shape()), to_string(x.shape()));
    result.push_back(g.dtype() == x.dtype() ? g : g.astype(x.dtype()));
  }
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> CustomOp::vmap(const std::vector<Array>& inputs,
                                                               const std::vector<int>& axes) {
  const CustomOpDefinition& d = *definition_;
  if (d.vmap) {
    auto [outs, out_axes] = d.vmap(inputs, axes, attributes_);
    if (outs.size() != out_axes.size())
      fail<TransformError>("vmap: the batching rule of custom op '{}' returned {} outputs and {} axes", d.name,
                           outs.size(), out_axes.size());
    return {outs, out_axes};
  }
  return rules::loop_vmap([&](const std::vector<Array>& xs) { return apply_custom_op(definition_, xs, attributes_); },
                          inputs, axes, d.name.c_str());
}

Cost CustomOp::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  if (definition_->cost) return definition_->cost(specs_of(inputs), specs_of(outputs), attributes_);
  return Primitive::cost(inputs, outputs);
}

}  // namespace tessera
