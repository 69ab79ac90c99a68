// vjp and batching rules of layout primitives.
#include "tessera/ir/primitives/layout.h"

#include <fmt/ranges.h>

#include "core/primitives/rule_utils.h"
#include "tessera/core/ops.h"

namespace tessera {

std::string Reshape::attributes() const { return "shape=" + to_string(shape_); }

std::vector<Array> Reshape::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                const std::vector<int>&, const std::vector<Array>&) {
  return {reshape(cotangents[0], primals[0].shape())};
}

std::pair<std::vector<Array>, std::vector<int>> Reshape::vmap(const std::vector<Array>& inputs,
                                                              const std::vector<int>& axes) {
  Array x = rules::batch_to_front(inputs[0], axes[0]);
  Shape shape = shape_;
  shape.insert(shape.begin(), x.shape()[0]);
  return {{reshape(x, shape)}, {0}};
}

std::string Transpose::attributes() const { return fmt::format("perm={}", perm_); }

std::vector<Array> Transpose::vjp(const std::vector<Array>&, const std::vector<Array>& cotangents,
                                  const std::vector<int>&, const std::vector<Array>&) {
  std::vector<int> inverse(perm_.size());
  for (size_t i = 0; i < perm_.size(); ++i) inverse[perm_[i]] = static_cast<int>(i);
  return {transpose(cotangents[0], inverse)};
}

std::pair<std::vector<Array>, std::vector<int>> Transpose::vmap(const std::vector<Array>& inputs,
                                                                const std::vector<int>& axes) {
  Array x = rules::batch_to_front(inputs[0], axes[0]);
  std::vector<int> perm{0};
  for (int p : perm_) perm.push_back(p + 1);
  return {{transpose(x, perm)}, {0}};
}

std::string BroadcastTo::attributes() const { return "shape=" + to_string(shape_); }

std::vector<Array> BroadcastTo::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                    const std::vector<int>&, const std::vector<Array>&) {
  return {rules::sum_to_shape(cotangents[0], primals[0].shape())};
}

std::pair<std::vector<Array>, std::vector<int>> BroadcastTo::vmap(const std::vector<Array>& inputs,
                                                                  const std::vector<int>& axes) {
  Array x = rules::batched_operand(inputs[0], axes[0], static_cast<int>(shape_.size()));
  Shape shape = shape_;
  shape.insert(shape.begin(), x.shape()[0]);
  return {{broadcast_to(x, shape)}, {0}};
}

std::string Slice::attributes() const { return fmt::format("start={}, stop={}, step={}", start_, stop_, step_); }

Cost Slice::cost(const std::vector<Array>&, const std::vector<Array>& outputs) const {
  return {0, 2.0 * static_cast<double>(outputs.at(0).nbytes())};
}

std::vector<Array> Slice::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                              const std::vector<int>&, const std::vector<Array>&) {
  const Array& g = cotangents[0];
  return {
      Array::make(primals[0].shape(), g.dtype(), std::make_shared<SlicePad>(primals[0].shape(), start_, step_), {g})};
}

std::pair<std::vector<Array>, std::vector<int>> Slice::vmap(const std::vector<Array>& inputs,
                                                            const std::vector<int>& axes) {
  Array x = rules::batch_to_front(inputs[0], axes[0]);
  std::vector<int64_t> start{0}, stop{x.shape()[0]}, step{1};
  start.insert(start.end(), start_.begin(), start_.end());
  stop.insert(stop.end(), stop_.begin(), stop_.end());
  step.insert(step.end(), step_.begin(), step_.end());
  return {{slice(x, start, stop, step)}, {0}};
}

std::string SlicePad::attributes() const {
  return fmt::format("shape={}, start={}, step={}", to_string(shape_), start_, step_);
}

std::vector<Array> SlicePad::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                 const std::vector<int>&, const std::vector<Array>&) {
  std::vector<int64_t> stop(shape_.size());
  for (size_t i = 0; i < shape_.size(); ++i) stop[i] = start_[i] + (primals[0].shape()[i] - 1) * step_[i] + 1;
  return {slice(cotangents[0], start_, stop, step_)};
}

std::pair<std::vector<Array>, std::vector<int>> SlicePad::vmap(const std::vector<Array>& inputs,
                                                               const std::vector<int>& axes) {
  Array x = rules::batch_to_front(inputs[0], axes[0]);
  Shape shape = shape_;
  shape.insert(shape.begin(), x.shape()[0]);
  std::vector<int64_t> start{0}, step{1};
  start.insert(start.end(), start_.begin(), start_.end());
  step.insert(step.end(), step_.begin(), step_.end());
  return {{Array::make(shape, x.dtype(), std::make_shared<SlicePad>(shape, start, step), {x})}, {0}};
}

std::string Concatenate::attributes() const { return fmt::format("axis={}", axis_); }

std::vector<Array> Concatenate::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                    const std::vector<int>& argnums, const std::vector<Array>&) {
  std::vector<int64_t> offsets{0};
  for (const Array& p : primals) offsets.push_back(offsets.back() + p.shape()[axis_]);
  std::vector<Array> result;
  for (int arg : argnums) result.push_back(slice_axis(cotangents[0], axis_, offsets[arg], offsets[arg + 1]));
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> Concatenate::vmap(const std::vector<Array>& inputs,
                                                                  const std::vector<int>& axes) {
  int64_t n = rules::batch_size(inputs, axes, "concatenate");
  std::vector<Array> batched;
  for (size_t i = 0; i < inputs.size(); ++i) batched.push_back(rules::batched_or_broadcast(inputs[i], axes[i], n));
  return {{concatenate(batched, axis_ + 1)}, {0}};
}

// Both memory moves are identities on values: gradients and batches pass through.
std::vector<Array> OffloadToHost::vjp(const std::vector<Array>&, const std::vector<Array>& cotangents,
                                      const std::vector<int>&, const std::vector<Array>&) {
  return {cotangents[0]};
}

std::pair<std::vector<Array>, std::vector<int>> OffloadToHost::vmap(const std::vector<Array>& inputs,
                                                                    const std::vector<int>& axes) {
  return {{inputs[0]}, {axes[0]}};
}

Cost OffloadToHost::cost(const std::vector<Array>& inputs, const std::vector<Array>&) const {
  return {0, static_cast<double>(2 * inputs[0].nbytes())};
}

std::vector<Array> LoadFromHost::vjp(const std::vector<Array>&, const std::vector<Array>& cotangents,
                                     const std::vector<int>&, const std::vector<Array>&) {
  return {cotangents[0]};
}

std::pair<std::vector<Array>, std::vector<int>> LoadFromHost::vmap(const std::vector<Array>& inputs,
                                                                   const std::vector<int>& axes) {
  return {{inputs[0]}, {axes[0]}};
}

Cost LoadFromHost::cost(const std::vector<Array>& inputs, const std::vector<Array>&) const {
  return {0, static_cast<double>(2 * inputs[0].nbytes())};
}

}  // namespace tessera
