// CPU evaluation of Fusion: lowers the program to the raw-pointer fused kernel (once per
// Fusion; the kernel keeps its tile plans, so repeated runs allocate nothing).
#include <algorithm>
#include <memory>
#include <mutex>

#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/fused_elementwise.h"
#include "tessera/base/small_vector.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/fusion.h"

namespace tessera {

namespace {

cpu::FusedProgram lower(const FusionProgram& p) {
  cpu::FusedProgram out;
  for (const FusionInput& in : p.inputs) out.input_dtypes.push_back(in.dtype);
  for (const FusionInstruction& in : p.body) {
    cpu::FusedInstruction k;
    switch (in.kind) {
      case FusionInstruction::Kind::Unary:
        k.kind = cpu::FusedOpKind::Unary;
        break;
      case FusionInstruction::Kind::Binary:
        k.kind = cpu::FusedOpKind::Binary;
        break;
      case FusionInstruction::Kind::Where:
        k.kind = cpu::FusedOpKind::Where;
        break;
      case FusionInstruction::Kind::Convert:
        k.kind = cpu::FusedOpKind::Cast;
        break;
    }
    k.op = in.op;
    k.dtype = in.dtype;
    for (size_t a = 0; a < in.args.size() && a < 3; ++a) k.args[a] = in.args[a];
    out.body.push_back(k);
  }
  out.outputs = p.outputs;
  return out;
}

}  // namespace

void Fusion::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const FusionProgram& p = program_;
  if (inputs.size() != p.inputs.size() || outputs.size() != p.outputs.size())
    fail<ValueError>("fusion: called with {} inputs and {} outputs (the program has {} and {})", inputs.size(),
                     outputs.size(), p.inputs.size(), p.outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].shape() != p.inputs[i].shape || inputs[i].dtype() != p.inputs[i].dtype)
      fail<ShapeError>("fusion: input {} is {} (the program expects {}{})", i, type_string(inputs[i]),
                       tessera::name(p.inputs[i].dtype), to_string(p.inputs[i].shape));
  // The reduce axes are trailing: the output is the leading `shape` dims.
  const size_t out_rank = p.shape.size() - (p.reduce ? p.reduce_axes.size() : 0);
  const DimsRef out_shape(p.shape.data(), out_rank);
  for (size_t j = 0; j < outputs.size(); ++j) {
    const Shape& got = outputs[j].shape();
    if (!std::equal(got.begin(), got.end(), out_shape.begin(), out_shape.end()) ||
        outputs[j].dtype() != p.register_dtype(p.outputs[j]))
      fail<ShapeError>("fusion: output {} is {} (the program gives {}{})", j, type_string(outputs[j]),
                       tessera::name(p.register_dtype(p.outputs[j])), to_string(p.output_shape()));
    outputs[j].allocate();
  }
  std::shared_ptr<const cpu::FusedKernel> kernel;
  {
    std::lock_guard<std::mutex> lock(cpu_kernel_mutex_);
    if (!cpu_kernel_) {
      std::vector<Strides> strides;
      for (const FusionInput& in : p.inputs) strides.push_back(broadcast_strides(in.shape, p.shape));
      cpu_kernel_ = std::make_shared<const cpu::FusedKernel>(lower(p), std::move(strides), p.shape);
    }
    kernel = cpu_kernel_;
  }
  SmallVec<const void*, 16> in_ptrs;
  for (const Array& in : inputs) in_ptrs.push_back(in.raw_data());
  SmallVec<void*, 16> out_ptrs;
  for (Array& out : outputs) out_ptrs.push_back(out.mutable_raw_data());
  if (!p.reduce) {
    kernel->run(in_ptrs.data(), out_ptrs.data());
    return;
  }
  int64_t rows = 1, len = 1;
  for (size_t d = 0; d < out_rank; ++d) rows *= p.shape[d];
  for (int a : p.reduce_axes) len *= p.shape[a];
  kernel->reduce(in_ptrs.data(), *p.reduce == ReduceKind::Sum ? cpu::FusedReduceOp::Sum : cpu::FusedReduceOp::Max, rows,
                 len, out_ptrs[0]);
}

}  // namespace tessera
