// A custom op on the CPU: the definition's kernel over the raw buffers. The outputs are
// allocated here (or already bound to arena buffers by the executable), so the kernel
// only writes, at the shapes infer gave.
#include "core/custom_op_primitive.h"

namespace tessera {

void CustomOp::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  std::vector<InputBuffer> in;
  in.reserve(inputs.size());
  for (const Array& a : inputs) in.push_back({a.raw_data(), a.shape(), a.dtype()});
  std::vector<OutputBuffer> out;
  out.reserve(outputs.size());
  for (Array& a : outputs) {
    a.allocate();
    out.push_back({a.mutable_raw_data(), a.shape(), a.dtype()});
  }
  definition_->cpu_kernel(in, out, attributes_);
}

}  // namespace tessera
