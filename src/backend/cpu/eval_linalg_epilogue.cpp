// CPU evaluation of MatmulEpilogue: the tiled GEMM with the epilogue applied per tile.
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_int8.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/matmul_epilogue.h"

namespace tessera {

namespace {

// The bias ([N] or [1, ..., 1, N] of out's dtype), activation and pre-activation output
// of `o` as the kernels' GemmEpilogue (outputs allocated here).
cpu::GemmEpilogue epilogue_of(const MatmulEpilogue::Options& o, const std::vector<Array>& inputs,
                              std::vector<Array>& outputs, int64_t n) {
  Array& out = outputs[0];
  cpu::GemmEpilogue e;
  if (o.bias) {
    const Array& bias = inputs[2];
    bool row_vector = bias.ndim() >= 1 && bias.ndim() <= out.ndim() && bias.shape(-1) == n;
    for (int d = 0; d + 1 < bias.ndim(); ++d) row_vector = row_vector && bias.shape()[d] == 1;
    if (!row_vector || bias.dtype() != out.dtype())
      fail<ShapeError>("matmul_epilogue: bias must be {}[{}] or [1, ..., {}] (got {})", tessera::name(out.dtype()), n,
                       n, type_string(bias));
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
  return e;
}

}  // namespace

// int8: quantized_matmul's GEMM (a [..., m, k] or a transposed [k, m], b [k, n] or
// [n, k]; every leading dim of a is rows), nearest rounding, the epilogue per row.
void MatmulEpilogue::eval_int8(const std::vector<Array>& inputs, std::vector<Array>& outputs) const {
  const Options& o = options_;
  const Array& a = inputs[0];
  const Array& b = inputs[1];
  Array& out = outputs[0];
  cpu::MatmulShape s;
  s.n = out.shape(-1);
  s.m = s.n == 0 ? 0 : out.size() / s.n;
  s.k = a.shape(o.trans_a ? 0 : -1);
  s.trans_a = o.trans_a;
  s.trans_b = o.trans_b;
  const int64_t a_rows = o.trans_a ? a.shape(1) : (s.k == 0 ? 0 : a.size() / s.k);
  if ((o.trans_a && a.ndim() != 2) || b.ndim() != 2 || a_rows != s.m || b.shape(o.trans_b ? 1 : 0) != s.k ||
      b.shape(o.trans_b ? 0 : 1) != s.n || a.dtype() != out.dtype() || b.dtype() != out.dtype())
    fail<ShapeError>("matmul_epilogue (int8): operands {} and {} do not give {}", type_string(a), type_string(b),
                     type_string(out));
  const cpu::GemmEpilogue e = epilogue_of(o, inputs, outputs, s.n);
  if (out.size() == 0) return;
  cpu::quantized_matmul(a.dtype(), s, a.raw_data(), b.raw_data(), out.mutable_raw_data(), {}, {}, &e);
}

void MatmulEpilogue::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Options& o = options_;
  const size_t want_inputs = o.bias || o.activation_grad ? 3 : 2, want_outputs = o.pre_activation ? 2 : 1;
  if (inputs.size() != want_inputs || outputs.size() != want_outputs)
    fail<ValueError>("matmul_epilogue: called with {} inputs and {} outputs (expected {} and {})", inputs.size(),
                     outputs.size(), want_inputs, want_outputs);
  const Array& a = inputs[0];
  const Array& b = inputs[1];
  Array& out = outputs[0];
  if (o.int8) {
    eval_int8(inputs, outputs);
    return;
  }
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
  if (o.activation_grad) {
    // The unfused pair: the product rounded to the dtype, then the gradient kernel.
    const Array& x = inputs[2];
    if (x.shape() != out.shape() || x.dtype() != out.dtype())
      fail<ShapeError>("matmul_epilogue: the activation's input is {} (expected {})", type_string(x), type_string(out));
    out.allocate();
    if (out.size() == 0) return;
    cpu::matmul(a.dtype(), s, a.raw_data(), b.raw_data(), out.mutable_raw_data(), cpu::GemmEpilogue{});
    SmallDims strides;  // contiguous, as the unfused binary op reads them
    broadcast_strides_into(out.shape(), out.shape(), strides);
    cpu::binary(static_cast<cpu::BinaryOp>(BinaryKind::GeluTanhGrad), out.dtype(), x.raw_data(), strides,
                out.raw_data(), strides, out.mutable_raw_data(), out.shape());
    return;
  }
  const cpu::GemmEpilogue e = epilogue_of(o, inputs, outputs, s.n);
  if (out.size() == 0) return;
  cpu::matmul(a.dtype(), s, a.raw_data(), b.raw_data(), out.mutable_raw_data(), e);
}

}  // namespace tessera
