#include "backend/cuda/run_on_gpu.h"

#include "backend/cuda/device_allocator.h"
#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/runtime.h"

namespace tessera::cuda {

std::vector<Array> run_on_gpu(const Array& lazy_output, int device) {
  require_device(device);
  ensure_kernels_registered();
  const auto& op = lazy_output.impl()->op;
  if (!op) fail<ValueError>("run_on_gpu: {} is a leaf, not the output of an op", type_string(lazy_output));
  const std::string name = op->primitive->name();
  const KernelFn* kernel = find_kernel(name);
  if (kernel == nullptr) fail<ValueError>("run_on_gpu: no CUDA kernel for op '{}'", name);

  set_device(device);
  DeviceAllocator& alloc = DeviceAllocator::get(device);
  KernelContext ctx = make_context(device);
  std::vector<std::shared_ptr<void>> held;  // every block, freed after the final synchronize
  auto device_buffer = [&](size_t bytes) {
    held.push_back(alloc.allocate_shared(bytes));
    return held.back().get();
  };
  ctx.scratch = [&](size_t bytes) { return device_buffer(bytes); };

  std::vector<DeviceTensor> inputs;
  for (const Array& in : op->inputs) {
    DeviceTensor t{device_buffer(in.nbytes()), in.shape(), in.dtype()};
    if (in.nbytes() > 0)
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(t.data, in.raw_data(), in.nbytes(), cudaMemcpyHostToDevice, ctx.stream));
    inputs.push_back(std::move(t));
  }
  std::vector<DeviceTensor> outputs;
  for (size_t o = 0; o < op->output_shapes.size(); ++o) {
    DeviceTensor t{nullptr, op->output_shapes[o], op->output_dtypes[o]};
    t.data = device_buffer(t.nbytes());
    if (t.nbytes() > 0) TESSERA_CUDA_CHECK(cudaMemsetAsync(t.data, 0xFF, t.nbytes(), ctx.stream));
    outputs.push_back(std::move(t));
  }
  (*kernel)(*op->primitive, inputs, outputs, ctx);
  TESSERA_CUDA_CHECK(cudaGetLastError());
  std::vector<Array> results;
  for (const DeviceTensor& t : outputs) {
    Array host = Array::empty(t.shape, t.dtype);
    if (t.nbytes() > 0)
      TESSERA_CUDA_CHECK(
          cudaMemcpyAsync(host.mutable_raw_data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost, ctx.stream));
    results.push_back(std::move(host));
  }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  return results;
}

}  // namespace tessera::cuda
