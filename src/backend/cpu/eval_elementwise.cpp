// CPU evaluation of elementwise primitives.
#include "backend/cpu/kernels/elementwise.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/elementwise.h"

namespace tessera {

void Unary::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  cpu::unary(static_cast<cpu::UnaryOp>(kind_), x.dtype(), x.raw_data(), out.mutable_raw_data(), x.size());
}

void Binary::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& a = inputs[0];
  const Array& b = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  SmallDims sa, sb;
  broadcast_strides_into(a.shape(), out.shape(), sa);
  broadcast_strides_into(b.shape(), out.shape(), sb);
  cpu::binary(static_cast<cpu::BinaryOp>(kind_), a.dtype(), a.raw_data(), sa, b.raw_data(), sb, out.mutable_raw_data(),
              out.shape());
}

void Where::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  Array& out = outputs[0];
  out.allocate();
  const Shape& s = out.shape();
  SmallDims sc, sa, sb;
  broadcast_strides_into(inputs[0].shape(), s, sc);
  broadcast_strides_into(inputs[1].shape(), s, sa);
  broadcast_strides_into(inputs[2].shape(), s, sb);
  cpu::where(inputs[0].raw_data(), sc, out.dtype(), inputs[1].raw_data(), sa, inputs[2].raw_data(), sb,
             out.mutable_raw_data(), s);
}

void Cast::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  cpu::cast(x.dtype(), x.raw_data(), dtype_, out.mutable_raw_data(), x.size());
}

void StopGradient::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  outputs[0].share_storage(inputs[0]);
}

void Identity::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  outputs[0].share_storage(inputs[0]);
}

}  // namespace tessera
