// eval_cpu of the reduce family (ir/primitives/reduce.h).
#include "backend/cpu/kernels/reduce.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera {

void Reduce::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  cpu::reduce(static_cast<cpu::ReduceOp>(kind_), x.dtype(), x.raw_data(), x.shape(), axes_, out.mutable_raw_data());
}

void ArgReduce::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  cpu::arg_reduce(is_max_, x.dtype(), x.raw_data(), x.shape(), axis_, out.mutable_data<int64_t>());
}

}  // namespace tessera
