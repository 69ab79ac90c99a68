// vjp and batching rules of reductions.
#include "tessera/ir/primitives/reduce.h"

#include <fmt/ranges.h>

#include "core/primitives/rule_utils.h"
#include "tessera/core/ops.h"

namespace tessera {

std::string Reduce::name() const { return reduce_name(kind_); }

std::string Reduce::attributes() const { return fmt::format("axes={}", axes_); }

std::vector<Array> Reduce::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                               const std::vector<int>&, const std::vector<Array>& outputs) {
  const Array& x = primals[0];
  // Re-insert the reduced dims as size 1 so g and y broadcast against x.
  Shape kept = x.shape();
  for (int ax : axes_) kept[ax] = 1;
  Array g = reshape(cotangents[0], kept);
  Array y = reshape(outputs[0], kept);
  switch (kind_) {
    case ReduceKind::Sum:
      return {broadcast_to(g, x.shape())};
    case ReduceKind::Prod:
      return {broadcast_to(g * y, x.shape()) / x};
    case ReduceKind::Max:
    case ReduceKind::Min: {
      // Ties share the gradient equally (like torch.amax).
      Array mask = astype(equal(x, y), x.dtype());
      Array count = sum(mask, axes_, true);
      return {mask * (g / count)};
    }
  }
  return {};
}

std::pair<std::vector<Array>, std::vector<int>> Reduce::vmap(const std::vector<Array>& inputs,
                                                             const std::vector<int>& axes) {
  Array x = rules::batch_to_front(inputs[0], axes[0]);
  std::vector<int> shifted;
  for (int ax : axes_) shifted.push_back(ax + 1);
  Shape shape;
  for (int i = 0; i < x.ndim(); ++i)
    if (std::find(shifted.begin(), shifted.end(), i) == shifted.end()) shape.push_back(x.shape()[i]);
  return {{Array::make(shape, x.dtype(), std::make_shared<Reduce>(kind_, shifted), {x})}, {0}};
}

Cost Reduce::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  c.flops = static_cast<double>(inputs[0].size());
  return c;
}

std::string ArgReduce::attributes() const { return fmt::format("axis={}", axis_); }

std::pair<std::vector<Array>, std::vector<int>> ArgReduce::vmap(const std::vector<Array>& inputs,
                                                                const std::vector<int>& axes) {
  Array x = rules::batch_to_front(inputs[0], axes[0]);
  return {{is_max_ ? argmax(x, axis_ + 1) : argmin(x, axis_ + 1)}, {0}};
}

}  // namespace tessera
