#include "core/primitives/rule_utils.h"

#include "tessera/core/ops.h"

namespace tessera::rules {

Array sum_to_shape(const Array& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  int lead = g.ndim() - static_cast<int>(shape.size());
  std::vector<int> axes;
  for (int i = 0; i < g.ndim(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) axes.push_back(i);
  }
  Array s = axes.empty() ? g : sum(g, axes, true);
  return reshape(s, shape);
}

Array batch_to_front(const Array& x, int axis) { return axis == 0 ? x : moveaxis(x, axis, 0); }

int64_t batch_size(const std::vector<Array>& inputs, const std::vector<int>& axes, const char* op) {
  int64_t size = -1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (axes[i] < 0) continue;
    int64_t n = inputs[i].shape()[axes[i]];
    if (size >= 0 && n != size)
      fail<ShapeError>("vmap ({}): batched inputs have different batch sizes {} and {}", op, size, n);
    size = n;
  }
  if (size < 0) fail<TransformError>("vmap ({}): no batched input", op);
  return size;
}

Array batched_operand(const Array& x, int axis, int rank) {
  if (axis < 0) return x;
  Array front = batch_to_front(x, axis);
  int missing = rank - (front.ndim() - 1);
  if (missing <= 0) return front;
  Shape shape = front.shape();
  shape.insert(shape.begin() + 1, missing, 1);
  return reshape(front, shape);
}

Array batched_or_broadcast(const Array& x, int axis, int64_t size) {
  if (axis >= 0) return batch_to_front(x, axis);
  Shape shape = x.shape();
  shape.insert(shape.begin(), size);
  return broadcast_to(x, shape);
}

}  // namespace tessera::rules

namespace tessera::rules {

std::pair<std::vector<Array>, std::vector<int>> loop_vmap(
    const std::function<std::vector<Array>(const std::vector<Array>&)>& fn, const std::vector<Array>& inputs,
    const std::vector<int>& axes, const char* op) {
  int64_t n = batch_size(inputs, axes, op);
  std::vector<std::vector<Array>> per_output;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<Array> example;
    for (size_t k = 0; k < inputs.size(); ++k)
      example.push_back(axes[k] < 0 ? inputs[k] : squeeze(slice_axis(inputs[k], axes[k], i, i + 1), {axes[k]}));
    std::vector<Array> outs = fn(example);
    per_output.resize(outs.size());
    for (size_t o = 0; o < outs.size(); ++o) per_output[o].push_back(outs[o]);
  }
  std::vector<Array> stacked;
  for (auto& outs : per_output) stacked.push_back(stack(outs, 0));
  return {stacked, std::vector<int>(stacked.size(), 0)};
}

}  // namespace tessera::rules

namespace tessera::rules {

std::vector<Array> with_zero_cotangents(const std::vector<Array>& cotangents, const std::vector<Array>& outputs) {
  std::vector<Array> out = cotangents;
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].valid()) out[i] = zeros_like(outputs[i]);
  return out;
}

}  // namespace tessera::rules
