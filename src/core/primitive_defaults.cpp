#include "core/primitives/rule_utils.h"
#include "tessera/core/array.h"
#include "tessera/core/transforms.h"
#include "tessera/ir/primitive.h"

namespace tessera {

std::vector<Array> Primitive::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                  const std::vector<int>& argnums, const std::vector<Array>& outputs) {
  // Differentiate the composite form: d(composite)/d(primals) applied to the cotangents.
  auto fn = [this](const std::vector<Array>& xs) {
    std::vector<Array> outs = composite(xs);
    if (outs.empty())
      fail<TransformError>(
          "grad: '{}' is not differentiable (it has no vjp rule); wrap its input in stop_gradient() "
          "if it should be treated as a constant",
          name());
    return outs;
  };
  auto [outs, grads] = tessera::vjp(fn, primals, rules::with_zero_cotangents(cotangents, outputs));
  std::vector<Array> result;
  for (int i : argnums) result.push_back(grads[i]);
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> Primitive::vmap(const std::vector<Array>& inputs,
                                                                const std::vector<int>& axes) {
  std::vector<int> in_axes;
  for (int a : axes) in_axes.push_back(a < 0 ? kNotMapped : a);
  // Batch the composite form; a primitive with neither a rule nor a composite fails here.
  auto fn = [this](const std::vector<Array>& xs) {
    std::vector<Array> outs = composite(xs);
    if (outs.empty()) fail<TransformError>("vmap: '{}' has no batching rule and no composite form to batch", name());
    return outs;
  };
  std::vector<Array> outs = tessera::vmap(fn, in_axes)(inputs);
  return {outs, std::vector<int>(outs.size(), 0)};
}

std::vector<Array> Primitive::composite(const std::vector<Array>& /*inputs*/) const { return {}; }

Cost Primitive::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c;
  for (const Array& in : inputs) c.bytes += static_cast<double>(in.nbytes());
  for (const Array& out : outputs) {
    c.bytes += static_cast<double>(out.nbytes());
    c.flops += static_cast<double>(out.size());
  }
  return c;
}

}  // namespace tessera
