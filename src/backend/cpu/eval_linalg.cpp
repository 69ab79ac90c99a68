// CPU evaluation of Matmul and the gathers.
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/matmul.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/linalg.h"

namespace tessera {

void Matmul::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& a = inputs[0];
  const Array& b = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  cpu::MatmulShape s;
  s.m = out.shape(-2);
  s.n = out.shape(-1);
  s.k = a.shape(trans_a_ ? -2 : -1);
  s.batch = out.size() == 0 ? 0 : out.size() / (s.m * s.n);
  s.trans_a = trans_a_;
  s.trans_b = trans_b_;
  s.a_batch_stride = a.ndim() > 2 ? s.m * s.k : 0;
  s.b_batch_stride = b.ndim() > 2 ? s.k * s.n : 0;
  if (out.size() == 0) return;
  cpu::matmul(a.dtype(), s, a.raw_data(), b.raw_data(), out.mutable_raw_data());
}

}  // namespace tessera
