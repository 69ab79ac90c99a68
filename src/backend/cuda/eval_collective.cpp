// CUDA kernels of the collective primitives (spmd/collectives.h) in SPMD programs on
// GPUs: each runs its CollectivePlan (spmd/collective_plan.h) on the executable's
// stream — strided device copies (cudaMemcpy2DAsync), zero fills, ordered sums
// (kernels/ordered_sum.h) — with the block exchanges handed to the runtime's device
// transport (device_transport.h). The plan's sums are in group order, so a GPU run's
// reductions are bitwise the CPU communicators'. The mesh device comes from the
// runtime's current device (spmd::current_device(): SpmdExecutable runs each device's
// program on that device's thread).
#include <vector>

#include "backend/cuda/device_transport.h"
#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/ordered_sum.h"
#include "tessera/base/error.h"
#include "tessera/spmd/collective_plan.h"
#include "tessera/spmd/ragged_all_to_all.h"
#include "tessera/spmd/runtime.h"

namespace tessera::cuda {
namespace {

using spmd::PlanRef;
using spmd::PlanStep;

void collective_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                       const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& collective = primitive_as<spmd::Collective>(primitive, "collective");
  if (inputs.size() != 1 || outputs.size() != 1)
    fail<ValueError>("{}: called with {} inputs and {} outputs (expected 1 and 1)", collective.name(), inputs.size(),
                     outputs.size());
  const DeviceTensor& in = inputs[0];
  const DeviceTensor& out = outputs[0];
  const spmd::DeviceContext* context = spmd::current_device();
  if (context == nullptr)
    fail<ValueError>(
        "{} {{{}}}: runs over {} devices but no device is current (a GPU program with collectives runs through a "
        "sharded jit call, whose SpmdExecutable drives each device from its own thread)",
        collective.name(), collective.attributes(), collective.group_size());
  const int device = context->device;
  const spmd::Mesh& mesh = collective.mesh();
  if (device >= mesh.size())
    fail<ValueError>("{} {{{}}}: device {} is not in mesh {} ({} devices)", collective.name(), collective.attributes(),
                     device, mesh.to_string(), mesh.size());
  const std::vector<int> group = mesh.group(device, collective.axes());
  const spmd::CollectivePlan plan =
      spmd::plan_collective(collective, in.shape, in.dtype, mesh.index_in_group(device, collective.axes()));
  if (plan.output_bytes != out.nbytes())
    fail<ShapeError>("{} {{{}}}: output has {} bytes, the plan writes {}", collective.name(), collective.attributes(),
                     out.nbytes(), plan.output_bytes);
  char* staging = plan.staging_bytes > 0 ? static_cast<char*>(ctx.scratch(plan.staging_bytes)) : nullptr;
  auto at = [&](const PlanRef& ref) -> char* {
    switch (ref.buffer) {
      case PlanRef::Buffer::Input:
        return static_cast<char*>(in.data) + ref.offset;
      case PlanRef::Buffer::Output:
        return static_cast<char*>(out.data) + ref.offset;
      case PlanRef::Buffer::Staging:
        return staging + ref.offset;
    }
    return nullptr;
  };
  DeviceTransport* transport = nullptr;
  for (const PlanStep& s : plan.steps) {
    switch (s.kind) {
      case PlanStep::Kind::Copy:
        TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(at(s.dst), s.dst_pitch, at(s.src), s.src_pitch, s.width, s.rows,
                                             cudaMemcpyDeviceToDevice, ctx.stream));
        break;
      case PlanStep::Kind::Zero:
        TESSERA_CUDA_CHECK(cudaMemsetAsync(at(s.dst), 0, s.width, ctx.stream));
        break;
      case PlanStep::Kind::AllGather:
      case PlanStep::Kind::AllToAll:
        if (transport == nullptr) transport = &transport_for(*context);
        if (s.kind == PlanStep::Kind::AllGather)
          transport->all_gather(*context, ctx.device, group, at(s.src), at(s.dst), s.width, ctx.stream);
        else
          transport->all_to_all(*context, ctx.device, group, at(s.src), at(s.dst), s.width, ctx.stream);
        break;
      case PlanStep::Kind::OrderedSum:
        ordered_sum(at(s.src), s.members, s.stride, s.count, plan.dtype, at(s.dst), ctx.stream);
        break;
    }
  }
  spmd::record_device_collective(device, plan);
}

// ragged_all_to_all (expert parallelism's dropless dispatch and combine): the sizes and
// rows staged through host memory and moved by the communicator's all_to_all_v
// (spmd/ragged_all_to_all.h). Correct but synchronous; a device-side exchange (NCCL
// send/recv of the routed rows) is not written.
void ragged_all_to_all_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                              const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const auto& op = primitive_as<spmd::RaggedAllToAll>(primitive, "ragged_all_to_all");
  if (inputs.size() != 2 || outputs.size() != 1)
    fail<ValueError>("ragged_all_to_all: called with {} inputs and {} outputs (expected 2 and 1)", inputs.size(),
                     outputs.size());
  const DeviceTensor& in = inputs[0];
  const DeviceTensor& sizes = inputs[1];
  const DeviceTensor& out = outputs[0];
  const spmd::DeviceContext* context = spmd::current_device();
  if (context == nullptr && op.group_size() > 1)
    fail<ValueError>("ragged_all_to_all {{{}}}: runs over {} devices but no device is current", op.attributes(),
                     op.group_size());
  const DeviceTensor& groups_side = op.combine() ? out : in;  // [Gl, N, D]
  if (groups_side.shape.size() != 3 || sizes.shape.size() != 2 ||
      (sizes.dtype != DType::Int32 && sizes.dtype != DType::Int64))
    fail<ShapeError>("ragged_all_to_all: operands {}, {} -> {} (expected [groups, rows, width], int sizes [., E])",
                     to_string(in.shape), to_string(sizes.shape), to_string(out.shape));
  std::vector<char> in_host(in.nbytes()), out_host(out.nbytes()), sizes_host(sizes.nbytes());
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(in_host.data(), in.data, in.nbytes(), cudaMemcpyDeviceToHost, ctx.stream));
  TESSERA_CUDA_CHECK(
      cudaMemcpyAsync(sizes_host.data(), sizes.data, sizes.nbytes(), cudaMemcpyDeviceToHost, ctx.stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  std::vector<int64_t> counts(static_cast<size_t>(sizes.numel()));
  convert(sizes.dtype, sizes_host.data(), DType::Int64, counts.data(), sizes.numel());
  spmd::ragged_exchange(op, counts, sizes.shape[1], groups_side.shape[0], groups_side.shape[1],
                        static_cast<size_t>(groups_side.shape[2]) * itemsize(in.dtype), in_host.data(), out_host.data(),
                        context ? context->communicator : nullptr, context ? context->device : 0);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(out.data, out_host.data(), out.nbytes(), cudaMemcpyHostToDevice, ctx.stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // out_host must outlive the copy
}

}  // namespace

void register_collective_kernels() {
  for (const char* op : {"all_gather", "all_reduce", "all_to_all", "reduce_scatter", "shard_pad", "shard_slice"})
    register_kernel(op, collective_kernel, /*capturable=*/false);
  register_kernel("ragged_all_to_all", ragged_all_to_all_kernel, /*capturable=*/false);
}

}  // namespace tessera::cuda
