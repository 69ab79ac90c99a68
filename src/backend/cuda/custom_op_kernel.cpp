// Custom ops on the GPU (core/custom_op.h): the definition's CUDA C++ source, compiled
// with NVRTC the first time a program runs it (compile_module caches it per source and
// architecture for the process, so the lookup on later launches compiles nothing and a
// captured CUDA graph replays the launch), launched with the definition's grid, block
// and scalars. Parameters: input pointers, output pointers, then the scalars as
// long long, in that order.
#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/nvrtc_module.h"
#include "tessera/core/custom_op.h"

namespace tessera::cuda {
namespace {

std::vector<TensorSpec> specs(const std::vector<DeviceTensor>& tensors) {
  std::vector<TensorSpec> out;
  for (const DeviceTensor& t : tensors) out.push_back({t.shape, t.dtype});
  return out;
}

void launch_custom(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                   const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const CustomOpDefinition* def = custom_op_definition(primitive);
  const CustomAttributes* attributes = custom_op_attributes(primitive);
  if (def == nullptr || attributes == nullptr || !def->cuda)
    fail<Error>("cuda: op '{}' was given the custom-op kernel but is no custom op with CUDA source", primitive.name());
  const CustomCudaKernel& k = *def->cuda;
  std::shared_ptr<const NvrtcModule> module = compile_module(k.source, {k.kernel_name});
  const CudaLaunch launch = k.launch(specs(inputs), specs(outputs), *attributes);
  for (unsigned v : launch.block)
    if (v == 0) fail<ValueError>("cuda: custom op '{}': launch gave a block with a zero dimension", def->name);
  for (unsigned v : launch.grid)
    if (v == 0) return;  // nothing to do (an empty tensor)
  std::vector<void*> pointers;
  for (const DeviceTensor& t : inputs) pointers.push_back(t.data);
  for (const DeviceTensor& t : outputs) pointers.push_back(t.data);
  std::vector<long long> scalars(launch.scalars.begin(), launch.scalars.end());
  std::vector<void*> args;
  for (void*& p : pointers) args.push_back(&p);
  for (long long& s : scalars) args.push_back(&s);
  launch_kernel(module->kernel(0), dim3(launch.grid[0], launch.grid[1], launch.grid[2]),
                dim3(launch.block[0], launch.block[1], launch.block[2]), args.data(), launch.shared_bytes, ctx.stream);
}

}  // namespace

const KernelFn* custom_op_kernel(std::string_view op) {
  static const KernelFn kernel = launch_custom;
  std::shared_ptr<const CustomOpDefinition> def = find_custom_op(std::string(op));
  return def && def->cuda ? &kernel : nullptr;
}

}  // namespace tessera::cuda
