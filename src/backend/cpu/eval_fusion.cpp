// CPU evaluation of Fusion: lowers the program to the raw-pointer fused kernel.
#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/fused_elementwise.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/fusion.h"

namespace tessera {

static_assert(static_cast<int>(UnaryKind::Copy) == static_cast<int>(cpu::UnaryOp::Copy));
static_assert(static_cast<int>(BinaryKind::TanhGrad) == static_cast<int>(cpu::BinaryOp::TanhGrad));

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
  std::vector<const void*> in_ptrs;
  std::vector<Strides> strides;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].shape() != p.inputs[i].shape || inputs[i].dtype() != p.inputs[i].dtype)
      fail<ShapeError>("fusion: input {} is {} (the program expects {}{})", i, type_string(inputs[i]),
                       tessera::name(p.inputs[i].dtype), to_string(p.inputs[i].shape));
    in_ptrs.push_back(inputs[i].raw_data());
    strides.push_back(broadcast_strides(inputs[i].shape(), p.shape));
  }
  const Shape out_shape = p.output_shape();
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (outputs[j].shape() != out_shape || outputs[j].dtype() != p.register_dtype(p.outputs[j]))
      fail<ShapeError>("fusion: output {} is {} (the program gives {}{})", j, type_string(outputs[j]),
                       tessera::name(p.register_dtype(p.outputs[j])), to_string(out_shape));
    outputs[j].allocate();
  }
  const cpu::FusedProgram program = lower(p);
  if (!p.reduce) {
    std::vector<void*> out_ptrs;
    for (Array& out : outputs) out_ptrs.push_back(out.mutable_raw_data());
    cpu::fused_elementwise(program, in_ptrs, strides, out_ptrs, p.shape);
    return;
  }
  const int64_t rows = numel(out_shape);
  int64_t len = 1;
  for (int a : p.reduce_axes) len *= p.shape[a];
  cpu::fused_reduce(program, in_ptrs, strides, p.shape,
                    *p.reduce == ReduceKind::Sum ? cpu::FusedReduceOp::Sum : cpu::FusedReduceOp::Max, rows, len,
                    outputs[0].mutable_raw_data());
}

}  // namespace tessera
