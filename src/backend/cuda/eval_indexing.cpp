// CUDA kernels of the gathers and scatter-adds (ir/primitives/indexing.h): take (the
// embedding lookup), scatter_add (its gradient), take_along_axis and
// scatter_add_along_axis. Shapes are read as the CPU evals read them
// (backend/cpu/eval_linalg.cpp): a buffer is [outer, axis_len, inner] around the axis.
//
// Out-of-range indices cannot throw from the device: gathers write NaN (floating
// dtypes) or zero into the affected outputs and scatter-adds drop those updates (see
// kernels/gather.h).
#include <string>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/gather.h"
#include "tessera/base/error.h"
#include "tessera/ir/primitives/indexing.h"

namespace tessera::cuda {
namespace {

void check_counts(const char* op, const std::vector<DeviceTensor>& inputs, const std::vector<DeviceTensor>& outputs) {
  if (inputs.size() != 2 || outputs.size() != 1)
    fail<ValueError>("{}: called with {} inputs and {} outputs (expected 2 and 1)", op, inputs.size(), outputs.size());
}

struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
};

AxisView view(const char* op, const Shape& shape, int axis) {
  if (axis < 0 || axis >= static_cast<int>(shape.size()))
    fail<ValueError>("{}: axis {} of shape {}", op, axis, to_string(shape));
  AxisView v;
  for (int i = 0; i < axis; ++i) v.outer *= shape[i];
  v.len = shape[axis];
  for (size_t i = axis + 1; i < shape.size(); ++i) v.inner *= shape[i];
  return v;
}

void check_index(const char* op, const DeviceTensor& idx) {
  if (idx.dtype != DType::Int64 && idx.dtype != DType::Int32)
    fail<DTypeError>("{}: indices are {} (expected int64 or int32)", op, name(idx.dtype));
}

void take_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                 const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = primitive_as<Take>(primitive, "take");
  check_counts("take", inputs, outputs);
  const DeviceTensor& x = inputs[0];
  const DeviceTensor& idx = inputs[1];
  check_index("take", idx);
  const AxisView v = view("take", x.shape, p.axis());
  if (outputs[0].numel() != v.outer * idx.numel() * v.inner || outputs[0].dtype != x.dtype)
    fail<ShapeError>("take: output of {} elements of {} (expected {} of {})", outputs[0].numel(),
                     name(outputs[0].dtype), v.outer * idx.numel() * v.inner, name(x.dtype));
  gather(x.dtype, x.data, v.outer, v.len, v.inner, idx.data, idx.dtype, idx.numel(), outputs[0].data, ctx.stream);
}

void scatter_add_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                        const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = primitive_as<TakeScatterAdd>(primitive, "scatter_add");
  check_counts("scatter_add", inputs, outputs);
  const DeviceTensor& idx = inputs[0];
  const DeviceTensor& upd = inputs[1];
  const DeviceTensor& out = outputs[0];
  check_index("scatter_add", idx);
  const AxisView v = view("scatter_add", out.shape, p.axis());
  if (upd.numel() != v.outer * idx.numel() * v.inner || upd.dtype != out.dtype)
    fail<ShapeError>("scatter_add: updates of {} elements of {} (expected {} of {})", upd.numel(), name(upd.dtype),
                     v.outer * idx.numel() * v.inner, name(out.dtype));
  const size_t bytes = scatter_add_scratch_bytes(idx.numel(), v.len);
  void* scratch = bytes > 0 ? ctx.scratch(bytes) : nullptr;
  scatter_add(out.dtype, upd.data, v.outer, v.len, v.inner, idx.data, idx.dtype, idx.numel(), out.data, scratch, bytes,
              ctx.stream);
}

void check_along(const char* op, const DeviceTensor& idx, const Shape& full, int axis) {
  bool ok = idx.shape.size() == full.size();
  for (size_t d = 0; ok && d < full.size(); ++d) ok = static_cast<int>(d) == axis || idx.shape[d] == full[d];
  if (!ok)
    fail<ShapeError>("{}: indices of shape {} against {} (expected equal dims except axis {})", op,
                     to_string(idx.shape), to_string(full), axis);
}

void take_along_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                       const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = primitive_as<TakeAlong>(primitive, "take_along_axis");
  check_counts("take_along_axis", inputs, outputs);
  const DeviceTensor& x = inputs[0];
  const DeviceTensor& idx = inputs[1];
  check_index("take_along_axis", idx);
  check_along("take_along_axis", idx, x.shape, p.axis());
  if (outputs[0].shape != idx.shape || outputs[0].dtype != x.dtype)
    fail<ShapeError>("take_along_axis: output {} of {} (expected the indices' shape {} of {})",
                     to_string(outputs[0].shape), name(outputs[0].dtype), to_string(idx.shape), name(x.dtype));
  const AxisView v = view("take_along_axis", x.shape, p.axis());
  gather_along(x.dtype, x.data, v.outer, v.len, v.inner, idx.data, idx.dtype, idx.shape[p.axis()], outputs[0].data,
               ctx.stream);
}

void scatter_add_along_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                              const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = primitive_as<TakeAlongScatterAdd>(primitive, "scatter_add_along_axis");
  check_counts("scatter_add_along_axis", inputs, outputs);
  const DeviceTensor& idx = inputs[0];
  const DeviceTensor& upd = inputs[1];
  const DeviceTensor& out = outputs[0];
  check_index("scatter_add_along_axis", idx);
  check_along("scatter_add_along_axis", idx, out.shape, p.axis());
  if (upd.shape != idx.shape || upd.dtype != out.dtype)
    fail<ShapeError>("scatter_add_along_axis: updates {} of {} (expected the indices' shape {} of {})",
                     to_string(upd.shape), name(upd.dtype), to_string(idx.shape), name(out.dtype));
  const AxisView v = view("scatter_add_along_axis", out.shape, p.axis());
  scatter_add_along(out.dtype, upd.data, v.outer, v.len, v.inner, idx.data, idx.dtype, idx.shape[p.axis()], out.data,
                    ctx.stream);
}

}  // namespace

void register_indexing_kernels() {
  register_kernel("take", take_kernel);
  register_kernel("scatter_add", scatter_add_kernel);
  register_kernel("take_along_axis", take_along_kernel);
  register_kernel("scatter_add_along_axis", scatter_add_along_kernel);
}

}  // namespace tessera::cuda
