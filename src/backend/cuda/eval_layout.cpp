// CUDA kernels of the layout primitives (ir/primitives/layout.h): reshape, transpose,
// broadcast_to, slice, slice_pad, concatenate. Shapes and attributes are read exactly
// as the CPU evals read them (backend/cpu/eval_layout.cpp); the kernels move bytes, so
// every dtype is supported.
#include <string>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/copy.h"
#include "tessera/base/error.h"
#include "tessera/ir/primitives/layout.h"

namespace tessera::cuda {
namespace {

void check_counts(const char* op, const std::vector<DeviceTensor>& inputs, const std::vector<DeviceTensor>& outputs,
                  size_t want_in) {
  if (inputs.size() != want_in || outputs.size() != 1)
    fail<ValueError>("{}: called with {} inputs and {} outputs (expected {} and 1)", op, inputs.size(), outputs.size(),
                     want_in);
}

void check_same_dtype(const char* op, const DeviceTensor& in, const DeviceTensor& out) {
  if (in.dtype != out.dtype)
    fail<DTypeError>("{}: input is {} but the output is {} (expected equal dtypes)", op, name(in.dtype),
                     name(out.dtype));
}

// Reshape shares its input's buffer in compiled programs (Primitive::aliases_input);
// when the executable gave the output its own buffer, the bytes are copied.
void reshape_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                    const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  check_counts("reshape", inputs, outputs, 1);
  check_same_dtype("reshape", inputs[0], outputs[0]);
  if (inputs[0].numel() != outputs[0].numel())
    fail<ShapeError>("reshape: {} elements into {} (expected equal counts)", inputs[0].numel(), outputs[0].numel());
  copy_bytes(inputs[0].data, outputs[0].data, outputs[0].nbytes(), ctx.stream);
}

void transpose_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                      const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = primitive_as<Transpose>(primitive, "transpose");
  check_counts("transpose", inputs, outputs, 1);
  check_same_dtype("transpose", inputs[0], outputs[0]);
  const DeviceTensor& x = inputs[0];
  transpose(itemsize(x.dtype), x.data, x.shape, p.perm(), outputs[0].data, ctx.stream);
}

void broadcast_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                      const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  primitive_as<BroadcastTo>(primitive, "broadcast_to");
  check_counts("broadcast_to", inputs, outputs, 1);
  check_same_dtype("broadcast_to", inputs[0], outputs[0]);
  const DeviceTensor& x = inputs[0];
  broadcast_to(itemsize(x.dtype), x.data, x.shape, outputs[0].shape, outputs[0].data, ctx.stream);
}

void slice_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = primitive_as<Slice>(primitive, "slice");
  check_counts("slice", inputs, outputs, 1);
  check_same_dtype("slice", inputs[0], outputs[0]);
  const DeviceTensor& x = inputs[0];
  slice(itemsize(x.dtype), x.data, x.shape, p.start(), p.step(), outputs[0].shape, outputs[0].data, ctx.stream);
}

void slice_pad_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                      const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = primitive_as<SlicePad>(primitive, "slice_pad");
  check_counts("slice_pad", inputs, outputs, 1);
  check_same_dtype("slice_pad", inputs[0], outputs[0]);
  if (outputs[0].shape != p.shape())
    fail<ShapeError>("slice_pad: output shape {} (expected {})", to_string(outputs[0].shape), to_string(p.shape()));
  const DeviceTensor& x = inputs[0];
  slice_pad(itemsize(x.dtype), x.data, x.shape, p.shape(), p.start(), p.step(), outputs[0].data, ctx.stream);
}

void concatenate_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                        const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& p = primitive_as<Concatenate>(primitive, "concatenate");
  if (outputs.size() != 1 || inputs.empty())
    fail<ValueError>("concatenate: called with {} inputs and {} outputs (expected >= 1 and 1)", inputs.size(),
                     outputs.size());
  const DeviceTensor& out = outputs[0];
  const int rank = static_cast<int>(out.shape.size());
  const int axis = p.axis() < 0 ? p.axis() + rank : p.axis();
  if (axis < 0 || axis >= rank) fail<ValueError>("concatenate: axis {} of a rank-{} output", p.axis(), rank);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= out.shape[d];
  for (int d = axis + 1; d < rank; ++d) inner *= out.shape[d];
  std::vector<ConcatInput> parts;
  int64_t total = 0;
  for (const DeviceTensor& in : inputs) {
    check_same_dtype("concatenate", in, out);
    bool ok = in.shape.size() == out.shape.size();
    for (int d = 0; ok && d < rank; ++d) ok = d == axis || in.shape[d] == out.shape[d];
    if (!ok)
      fail<ShapeError>("concatenate: input of shape {} into output {} along axis {}", to_string(in.shape),
                       to_string(out.shape), axis);
    parts.push_back({in.data, in.shape[axis]});
    total += in.shape[axis];
  }
  if (total != out.shape[axis])
    fail<ShapeError>("concatenate: inputs add up to {} along axis {} (the output has {})", total, axis,
                     out.shape[axis]);
  concatenate(itemsize(out.dtype), parts, outer, inner, out.data, ctx.stream);
}

}  // namespace

void register_layout_kernels() {
  register_kernel("reshape", reshape_kernel);
  register_kernel("transpose", transpose_kernel);
  register_kernel("broadcast_to", broadcast_kernel);
  register_kernel("slice", slice_kernel);
  register_kernel("slice_pad", slice_pad_kernel);
  register_kernel("concatenate", concatenate_kernel);
}

}  // namespace tessera::cuda
