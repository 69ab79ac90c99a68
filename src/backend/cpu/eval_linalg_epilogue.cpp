// CPU evaluation of MatmulEpilogue: the tiled GEMM with the epilogue applied per tile.
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/matmul.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/matmul_epilogue.h"

namespace tessera {

void MatmulEpilogue::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Options& o = options_;
  const size_t want_inputs = o.bias ? 3 : 2, want_outputs = o.pre_activation ? 2 : 1;
  if (inputs.size() != want_inputs || outputs.size() != want_outputs)
    fail<ValueError>("matmul_epilogue: called with {} inputs and {} outputs (expected {} and {})", inputs.size(),
                     outputs.size(), want_inputs, want_outputs);
  const Array& a = inputs[0];
  const Array& b = inputs[1];
  Array& out = outputs[0];
  if (a.ndim() < 2 || b.ndim() < 2 || out.ndim() < 2)
    fail<ShapeError>("matmul_epilogue: operands and output must have rank >= 2 (got {}, {} -> {})", type_string(a),
                     type_string(b), type_string(out));
  cpu::MatmulShape s;
  s.m = out.shape(-2);
  s.n = out.shape(-1);
  s.k = a.shape(o.trans_a ? -2 : -1);
  if (a.shape(o.trans_a ? -1 : -2) != s.m || b.shape(o.trans_b ? -1 : -2) != s.k ||
      b.shape(o.trans_b ? -2 : -1) != s.n || a.dtype() != out.dtype() || b.dtype() != out.dtype())
    fail<ShapeError>("matmul_epilogue: operands {} and {} do not give {}", type_string(a), type_string(b),
                     type_string(out));
  s.batch = out.size() == 0 ? 0 : out.size() / (s.m * s.n);
  s.trans_a = o.trans_a;
  s.trans_b = o.trans_b;
  s.a_batch_stride = a.ndim() > 2 ? s.m * s.k : 0;
  s.b_batch_stride = b.ndim() > 2 ? s.k * s.n : 0;
  if ((a.ndim() > 2 && a.size() != s.batch * s.m * s.k) || (b.ndim() > 2 && b.size() != s.batch * s.k * s.n))
    fail<ShapeError>("matmul_epilogue: batch dims of {} and {} do not match the output {}", type_string(a),
                     type_string(b), type_string(out));
  cpu::GemmEpilogue e;
  if (o.bias) {
    const Array& bias = inputs[2];
    bool row_vector = bias.ndim() >= 1 && bias.ndim() <= out.ndim() && bias.shape(-1) == s.n;
    for (int d = 0; d + 1 < bias.ndim(); ++d) row_vector = row_vector && bias.shape()[d] == 1;
    if (!row_vector || bias.dtype() != out.dtype())
      fail<ShapeError>("matmul_epilogue: bias must be {}[{}] or [1, ..., {}] (got {})", tessera::name(out.dtype()), s.n,
                       s.n, type_string(bias));
    e.bias = bias.raw_data();
    e.bias_first = o.bias_first;
  }
  if (o.activation) {
    e.has_activation = true;
    e.activation = static_cast<cpu::UnaryOp>(*o.activation);
  }
  out.allocate();
  if (o.pre_activation) {
    if (outputs[1].shape() != out.shape() || outputs[1].dtype() != out.dtype())
      fail<ShapeError>("matmul_epilogue: pre-activation output is {} (expected {})", type_string(outputs[1]),
                       type_string(out));
    outputs[1].allocate();
    e.pre_activation = outputs[1].mutable_raw_data();
  }
  if (out.size() == 0) return;
  cpu::matmul(a.dtype(), s, a.raw_data(), b.raw_data(), out.mutable_raw_data(), e);
}

}  // namespace tessera
