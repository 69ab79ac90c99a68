// CPU evaluation of Matmul and the gathers.
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_int8.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/quantized.h"

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

void QuantizedMatmul::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& a = inputs[0];
  const Array& b = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  cpu::MatmulShape s;
  s.n = out.shape(-1);
  s.m = s.n == 0 ? 0 : out.size() / s.n;  // every leading dim of A is rows
  s.k = a.shape(config_.trans_a ? 0 : -1);
  s.trans_a = config_.trans_a;
  s.trans_b = config_.trans_b;
  cpu::Int8Rounding round_a, round_b;
  round_a.stochastic = config_.stochastic_a;
  round_b.stochastic = config_.stochastic_b;
  if (round_a.stochastic || round_b.stochastic) {
    if (inputs.size() < 3) fail<ValueError>("quantized_matmul: stochastic rounding needs a key input (it has none)");
    const auto* key = inputs[2].data<uint32_t>();
    round_a.seed = rounding_seed(key[0], key[1], 0);
    round_b.seed = rounding_seed(key[0], key[1], 1);
  }
  cpu::quantized_matmul(a.dtype(), s, a.raw_data(), b.raw_data(), out.mutable_raw_data(), round_a, round_b);
}

}  // namespace tessera
