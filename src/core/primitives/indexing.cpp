// vjp and batching rules of gathers and scatter-adds.
#include "tessera/ir/primitives/indexing.h"

#include <fmt/format.h>

#include <functional>

#include "core/primitives/rule_utils.h"
#include "tessera/core/ops.h"

namespace tessera {
namespace {

// vjp of a gather (inputs: table, indices): the cotangent scatter-added into zeros
// of the table's shape; indices get no gradient.
template <typename ScatterAdd>
std::vector<Array> gather_vjp(const std::vector<Array>& primals, const Array& g, const std::vector<int>& argnums,
                              int axis) {
  std::vector<Array> result;
  for (int arg : argnums) {
    result.push_back(arg == 1 ? zeros_like(primals[1])
                              : Array::make(primals[0].shape(), g.dtype(),
                                            std::make_shared<ScatterAdd>(primals[0].shape(), axis), {primals[1], g}));
  }
  return result;
}

// vjp of a scatter-add (inputs: indices, updates): the gather of the cotangent.
std::vector<Array> scatter_vjp(const std::vector<Array>& primals, const std::vector<int>& argnums,
                               const std::function<Array(const Array& indices)>& gather) {
  std::vector<Array> result;
  for (int arg : argnums) result.push_back(arg == 0 ? zeros_like(primals[0]) : gather(primals[0]));
  return result;
}

}  // namespace

std::string Take::attributes() const { return fmt::format("axis={}", axis_); }

std::vector<Array> Take::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<Array>&) {
  return gather_vjp<TakeScatterAdd>(primals, cotangents[0], argnums, axis_);
}

std::pair<std::vector<Array>, std::vector<int>> Take::vmap(const std::vector<Array>& inputs,
                                                           const std::vector<int>& axes) {
  const Array& x = inputs[0];
  const Array& idx = inputs[1];
  if (axes[1] < 0) {
    // Batched table, shared indices: gather along the shifted axis.
    return {{take(rules::batch_to_front(x, axes[0]), idx, axis_ + 1)}, {0}};
  }
  if (axes[0] < 0) {
    // Shared table, batched indices: the index dims (batch first) replace the axis.
    return {{take(x, rules::batch_to_front(idx, axes[1]), axis_)}, {axis_}};
  }
  // Both batched: flatten (batch, axis) of the table into one axis and offset the
  // indices by b * axis_len so one gather serves every example.
  Array xb = rules::batch_to_front(x, axes[0]);
  Array ib = rules::batch_to_front(idx, axes[1]);
  int64_t n = xb.shape(0), len = xb.shape(axis_ + 1);
  Array moved = moveaxis(xb, axis_ + 1, 1);  // [n, len, ...rest]
  Shape flat = moved.shape();
  flat.erase(flat.begin());
  flat[0] = n * len;
  Array table = reshape(moved, flat);
  Shape offset_shape(ib.ndim(), 1);
  offset_shape[0] = n;
  Array wrapped = where(less(ib, zeros({}, DType::Int64)), ib + static_cast<double>(len), ib);
  Array offsets = reshape(arange(n) * static_cast<double>(len), offset_shape);
  Array gathered = take(table, wrapped + offsets, 0);  // [n, idx..., rest(without axis)]
  // Restore the layout a.shape[:axis] + idx.shape + a.shape[axis+1:] behind the batch.
  int idx_rank = ib.ndim() - 1;
  std::vector<int> perm{0};
  for (int i = 0; i < axis_; ++i) perm.push_back(1 + idx_rank + i);
  for (int i = 0; i < idx_rank; ++i) perm.push_back(1 + i);
  for (int i = 1 + idx_rank + axis_; i < gathered.ndim(); ++i) perm.push_back(i);
  return {{transpose(gathered, perm)}, {0}};
}

std::string TakeScatterAdd::attributes() const { return fmt::format("shape={}, axis={}", to_string(shape_), axis_); }

std::vector<Array> TakeScatterAdd::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                       const std::vector<int>& argnums, const std::vector<Array>&) {
  return scatter_vjp(primals, argnums, [&](const Array& idx) { return take(cotangents[0], idx, axis_); });
}

std::string TakeAlong::attributes() const { return fmt::format("axis={}", axis_); }

std::vector<Array> TakeAlong::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                  const std::vector<int>& argnums, const std::vector<Array>&) {
  return gather_vjp<TakeAlongScatterAdd>(primals, cotangents[0], argnums, axis_);
}

std::string TakeAlongScatterAdd::attributes() const {
  return fmt::format("shape={}, axis={}", to_string(shape_), axis_);
}

std::vector<Array> TakeAlongScatterAdd::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                            const std::vector<int>& argnums, const std::vector<Array>&) {
  return scatter_vjp(primals, argnums, [&](const Array& idx) { return take_along_axis(cotangents[0], idx, axis_); });
}

}  // namespace tessera

namespace tessera {

std::pair<std::vector<Array>, std::vector<int>> TakeScatterAdd::vmap(const std::vector<Array>& inputs,
                                                                     const std::vector<int>& axes) {
  Shape shape = shape_;
  int axis = axis_;
  return rules::loop_vmap(
      [shape, axis](const std::vector<Array>& in) {
        return std::vector<Array>{
            Array::make(shape, in[1].dtype(), std::make_shared<TakeScatterAdd>(shape, axis), {in[0], in[1]})};
      },
      inputs, axes, "scatter_add");
}

std::pair<std::vector<Array>, std::vector<int>> TakeAlong::vmap(const std::vector<Array>& inputs,
                                                                const std::vector<int>& axes) {
  int64_t n = rules::batch_size(inputs, axes, "take_along_axis");
  Array x = rules::batched_or_broadcast(inputs[0], axes[0], n);
  Array idx = rules::batched_or_broadcast(inputs[1], axes[1], n);
  return {{take_along_axis(x, idx, axis_ + 1)}, {0}};
}

std::pair<std::vector<Array>, std::vector<int>> TakeAlongScatterAdd::vmap(const std::vector<Array>& inputs,
                                                                          const std::vector<int>& axes) {
  int64_t n = rules::batch_size(inputs, axes, "scatter_add_along_axis");
  Array idx = rules::batched_or_broadcast(inputs[0], axes[0], n);
  Array upd = rules::batched_or_broadcast(inputs[1], axes[1], n);
  Shape shape = shape_;
  shape.insert(shape.begin(), n);
  return {{Array::make(shape, upd.dtype(), std::make_shared<TakeAlongScatterAdd>(shape, axis_ + 1), {idx, upd})}, {0}};
}

}  // namespace tessera
