// CUDA evaluation of the reductions (ir/primitives/reduce.h): reduce_sum / reduce_prod /
// reduce_max / reduce_min over sorted axes (the reduced dims removed; keepdims is a
// reshape in the op layer) and argmax / argmin along one axis. Shapes and errors
// mirror the CPU evals (backend/cpu/eval_layout.cpp, kernels/reduce.cpp); the kernels
// are in kernels/reduce.cu.
#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/reduce.h"
#include "tessera/base/error.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera::cuda {

namespace {

void check_counts(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs) {
  if (inputs.size() != 1 || outputs.size() != 1)
    fail<ValueError>("{}: called with {} inputs and {} outputs (expected 1 and 1)", primitive.name(), inputs.size(),
                     outputs.size());
}

void reduce_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                   const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const Reduce& r = primitive_as<Reduce>(primitive, "reduce");
  check_counts(primitive, inputs, outputs);
  const std::string op = primitive.name();
  const DeviceTensor& x = inputs[0];
  const DeviceTensor& out = outputs[0];
  const std::vector<int>& axes = r.axes();
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i] < 0 || axes[i] >= static_cast<int>(x.shape.size()) || (i > 0 && axes[i] <= axes[i - 1]))
      fail<AxisError>("{}: axes must be sorted, unique and in [0, {}) (got axis {})", op, x.shape.size(), axes[i]);
  ReducePlan plan;
  if (!plan_reduce(x.dtype, x.shape, axes, &plan))
    fail<ShapeError>("{}: shape {} reduced over {} axes alternates kept and reduced dims more than {} times", op,
                     to_string(x.shape), axes.size(), kReduceMaxDims);
  if (out.numel() != plan.out_numel || out.dtype != x.dtype)
    fail<ShapeError>("{}: output {}{} (expected {} elements of {})", op, name(out.dtype), to_string(out.shape),
                     plan.out_numel, name(x.dtype));
  if (plan.kind == ReducePlan::Kind::Fill && (r.kind() == ReduceKind::Max || r.kind() == ReduceKind::Min))
    fail<ValueError>("{}: reduction over an empty axis of shape {} has no identity", op, to_string(x.shape));
  void* scratch = nullptr;
  if (plan.scratch_bytes > 0) {
    if (!ctx.scratch) fail<Error>("{}: needs {} bytes of scratch and the context has none", op, plan.scratch_bytes);
    scratch = ctx.scratch(plan.scratch_bytes);
  }
  TESSERA_CUDA_CHECK(reduce(static_cast<ReduceOp>(r.kind()), x.dtype, plan, x.data, out.data, scratch, ctx.stream));
}

void arg_reduce_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                       const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const ArgReduce& r = primitive_as<ArgReduce>(primitive, "arg_reduce");
  check_counts(primitive, inputs, outputs);
  const std::string op = primitive.name();
  const DeviceTensor& x = inputs[0];
  const DeviceTensor& out = outputs[0];
  const int axis = r.axis();
  if (axis < 0 || axis >= static_cast<int>(x.shape.size()))
    fail<AxisError>("{}: axis {} out of range for shape {}", op, axis, to_string(x.shape));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape[d];
  for (size_t d = static_cast<size_t>(axis) + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  const int64_t len = x.shape[axis];
  if (out.numel() != outer * inner || out.dtype != DType::Int64)
    fail<ShapeError>("{}: output {}{} (expected {} elements of int64)", op, name(out.dtype), to_string(out.shape),
                     outer * inner);
  if (outer * inner == 0) return;
  if (len == 0) fail<ValueError>("{}: empty axis {} of shape {}", op, axis, to_string(x.shape));
  TESSERA_CUDA_CHECK(
      arg_reduce(op == "argmax", x.dtype, x.data, outer, len, inner, static_cast<int64_t*>(out.data), ctx.stream));
}

}  // namespace

void register_reduce_kernels() {
  for (const char* op : {"reduce_sum", "reduce_prod", "reduce_max", "reduce_min"}) register_kernel(op, reduce_kernel);
  register_kernel("argmax", arg_reduce_kernel);
  register_kernel("argmin", arg_reduce_kernel);
}

}  // namespace tessera::cuda
