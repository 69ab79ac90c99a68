// eval_cpu of the indexing family (ir/primitives/indexing.h): gathers and their
// scatter-add transposes.
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/gather.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/indexing.h"

namespace tessera {

namespace {
struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
};
AxisView view(const Shape& shape, int axis) {
  AxisView v;
  for (int i = 0; i < axis; ++i) v.outer *= shape[i];
  v.len = shape[axis];
  for (size_t i = axis + 1; i < shape.size(); ++i) v.inner *= shape[i];
  return v;
}
}  // namespace

void Take::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  const Array& idx = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  AxisView v = view(x.shape(), axis_);
  cpu::gather(x.dtype(), x.raw_data(), v.outer, v.len, v.inner, idx.data<int64_t>(), idx.size(),
              out.mutable_raw_data());
}

void TakeScatterAdd::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& idx = inputs[0];
  const Array& upd = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  cpu::fill(out.dtype(), 0.0, out.mutable_raw_data(), out.size());
  AxisView v = view(shape_, axis_);
  cpu::scatter_add(upd.dtype(), upd.raw_data(), v.outer, v.len, v.inner, idx.data<int64_t>(), idx.size(),
                   out.mutable_raw_data());
}

void TakeAlong::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  const Array& idx = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  AxisView v = view(x.shape(), axis_);
  cpu::gather_along(x.dtype(), x.raw_data(), v.outer, v.len, v.inner, idx.data<int64_t>(), idx.shape()[axis_],
                    out.mutable_raw_data());
}

void TakeAlongScatterAdd::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& idx = inputs[0];
  const Array& upd = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  cpu::fill(out.dtype(), 0.0, out.mutable_raw_data(), out.size());
  AxisView v = view(shape_, axis_);
  cpu::scatter_add_along(upd.dtype(), upd.raw_data(), v.outer, v.len, v.inner, idx.data<int64_t>(), idx.shape()[axis_],
                         out.mutable_raw_data());
}

}  // namespace tessera
