// Collective primitives: construction and shape checks (the builders), the IR
// attributes, vjps, cost, and eval_cpu (rearranging memory around the
// communicator's member-major block layout).
#include "tessera/spmd/collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "spmd/block_layout.h"
#include "tessera/base/error.h"
#include "tessera/spmd/runtime.h"

namespace tessera::spmd {
namespace {

void check_axes(const Mesh& mesh, const std::vector<int>& axes, std::string_view op) {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || axes[i] >= mesh.ndim())
      fail<AxisError>("{}: mesh axis {} is out of range for mesh {} ({} axes)", op, axes[i], mesh.to_string(),
                      mesh.ndim());
    for (size_t j = 0; j < i; ++j)
      if (axes[i] == axes[j]) fail<AxisError>("{}: mesh axis '{}' is listed twice", op, mesh.axis_name(axes[i]));
  }
}

bool is_reducible(DType dtype) {
  switch (dtype) {
    case DType::Float32:
    case DType::Float64:
    case DType::BFloat16:
    case DType::Float16:
    case DType::Int32:
    case DType::Int64:
      return true;
    default:
      return false;
  }
}

// dst[b][a] = src[a][b] for blocks of `block` bytes (src is [A][B] blocks): moves
// between a row-major layout split along a dim and the communicator's member-major
// layout.
void swap_block_axes(const char* src, int64_t a_count, int64_t b_count, size_t block, char* dst) {
  for (int64_t a = 0; a < a_count; ++a)
    for (int64_t b = 0; b < b_count; ++b)
      std::memcpy(dst + static_cast<size_t>(b * a_count + a) * block,
                  src + static_cast<size_t>(a * b_count + b) * block, block);
}

}  // namespace

std::string to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllGather:
      return "all_gather";
    case CollectiveKind::AllReduce:
      return "all_reduce";
    case CollectiveKind::ReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::AllToAll:
      return "all_to_all";
    case CollectiveKind::ShardSlice:
      return "shard_slice";
    case CollectiveKind::ShardPad:
      return "shard_pad";
  }
  return "collective";
}

Collective::Collective(CollectiveKind kind, Mesh mesh, std::vector<int> axes, int dim, int concat_dim)
    : kind_(kind), mesh_(std::move(mesh)), axes_(std::move(axes)), dim_(dim), concat_dim_(concat_dim) {
  check_axes(mesh_, axes_, to_string(kind_));
  if (kind_ != CollectiveKind::AllReduce && dim_ < 0)
    fail<AxisError>("{}: dim {} is negative (the builders normalize it; expected 0 <= dim < ndim)", to_string(kind_),
                    dim_);
  if (kind_ == CollectiveKind::AllToAll && concat_dim_ < 0)
    fail<AxisError>("all_to_all: concat dim {} is negative (expected 0 <= concat < ndim)", concat_dim_);
}

std::string Collective::attributes() const {
  const std::string axes = "axes=" + mesh_.axes_text(axes_);
  const std::string mesh = "mesh=" + mesh_.to_string();
  switch (kind_) {
    case CollectiveKind::AllReduce:
      return fmt::format("{}, {}", axes, mesh);
    case CollectiveKind::AllToAll:
      return fmt::format("{}, split={}, concat={}, {}", axes, dim_, concat_dim_, mesh);
    default:
      return fmt::format("{}, dim={}, {}", axes, dim_, mesh);
  }
}

double Collective::bytes_sent(double input_bytes) const {
  const double n = group_size();
  switch (kind_) {
    case CollectiveKind::AllGather:
      return (n - 1) * input_bytes;  // the gathered buffer is n * input
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll:
      return (n - 1) / n * input_bytes;
    case CollectiveKind::AllReduce:
      return 2 * (n - 1) / n * input_bytes;
    case CollectiveKind::ShardSlice:
    case CollectiveKind::ShardPad:
      return 0;
  }
  return 0;
}

Cost Collective::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  // Communicating collectives: the bytes this device sends (what the cost model
  // times against the interconnect). Slice and pad are local copies: their reads and
  // writes, like any layout op.
  if (kind_ == CollectiveKind::ShardSlice || kind_ == CollectiveKind::ShardPad)
    return {0, static_cast<double>(inputs[0].nbytes() + outputs[0].nbytes())};
  return {0, bytes_sent(static_cast<double>(inputs[0].nbytes()))};
}

std::vector<Array> Collective::vjp(const std::vector<Array>&, const std::vector<Array>& cotangents,
                                   const std::vector<int>&, const std::vector<Array>&) {
  // The exact transposes of the per-device linear maps (see the header): checked by
  // the dot-product test in tests/spmd/test_collectives.cpp.
  const Array& g = cotangents[0];
  switch (kind_) {
    case CollectiveKind::AllGather:
      return {reduce_scatter(g, mesh_, axes_, dim_)};
    case CollectiveKind::ReduceScatter:
      return {all_gather(g, mesh_, axes_, dim_)};
    case CollectiveKind::AllReduce:
      return {all_reduce(g, mesh_, axes_)};
    case CollectiveKind::AllToAll:
      return {all_to_all(g, mesh_, axes_, concat_dim_, dim_)};
    case CollectiveKind::ShardSlice:
      // Device d's slice reads only block d of its own input: the transpose writes the
      // cotangent back there and zeros elsewhere. (Summing these over the group gives
      // the all_gather of the cotangents; all_gather on every device would give n
      // times the gradient once the replicas' contributions are summed.)
      return {shard_pad(g, mesh_, axes_, dim_)};
    case CollectiveKind::ShardPad:
      return {shard_slice(g, mesh_, axes_, dim_)};
  }
  return {};
}

void Collective::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  const int n = group_size();
  const DeviceContext* context = current_device();
  if (!context) {
    if (n == 1 && x.nbytes() == out.nbytes()) {  // a group of one device: nothing moves
      if (x.nbytes() > 0) std::memcpy(out.mutable_raw_data(), x.raw_data(), x.nbytes());
      return;
    }
    fail<ValueError>(
        "{} {{{}}}: runs over {} devices but no device is current (evaluate it inside "
        "spmd::run_on_devices, e.g. through a jitted sharded function)",
        name(), attributes(), n);
  }
  // Every member has the same local shapes: all skip an empty collective together.
  if (x.size() == 0 || out.size() == 0) return;
  const int device = context->device;
  if (device >= mesh_.size())
    fail<ValueError>("{} {{{}}}: device {} is not in mesh {} ({} devices)", name(), attributes(), device,
                     mesh_.to_string(), mesh_.size());
  Communicator& comm = *context->communicator;
  const std::vector<int> group = mesh_.group(device, axes_);
  const int64_t index = mesh_.index_in_group(device, axes_);
  const size_t item = x.itemsize();
  const char* in = static_cast<const char*>(x.raw_data());
  char* result = static_cast<char*>(out.mutable_raw_data());

  switch (kind_) {
    case CollectiveKind::AllReduce:
      comm.all_reduce(device, group, in, result, static_cast<size_t>(x.size()), x.dtype());
      return;

    case CollectiveKind::AllGather: {
      // The communicator concatenates whole blocks: [n][outer][dim*inner]. Unless the
      // gathered dim is the outermost non-trivial one, move the member axis inward.
      const Split3 s = split_at(x.shape(), dim_);
      const size_t row = static_cast<size_t>(s.dim * s.inner) * item;
      if (s.outer == 1) {
        comm.all_gather(device, group, in, result, x.nbytes());
      } else {
        std::vector<char> gathered(static_cast<size_t>(n) * x.nbytes());
        comm.all_gather(device, group, in, gathered.data(), x.nbytes());
        swap_block_axes(gathered.data(), n, s.outer, row, result);
      }
      return;
    }

    case CollectiveKind::ReduceScatter: {
      // Member j's block is rows [j*b, (j+1)*b) of dim: bring the blocks to the front.
      const Split3 s = split_at(x.shape(), dim_);
      const size_t count = static_cast<size_t>(out.size());
      const size_t row = static_cast<size_t>(s.dim / n * s.inner) * item;
      if (s.outer == 1) {
        comm.reduce_scatter(device, group, in, result, count, x.dtype());
      } else {
        std::vector<char> blocks(x.nbytes());
        swap_block_axes(in, s.outer, n, row, blocks.data());
        comm.reduce_scatter(device, group, blocks.data(), result, count, x.dtype());
      }
      return;
    }

    case CollectiveKind::AllToAll: {
      // Send: block j along the split dim to member j. Receive: member k's block along
      // the concat dim, in group order.
      const Split3 split = split_at(x.shape(), dim_);
      const size_t block = x.nbytes() / static_cast<size_t>(n);
      std::vector<char> send;
      const char* send_data = in;
      if (split.outer > 1) {
        send.resize(x.nbytes());
        swap_block_axes(in, split.outer, n, static_cast<size_t>(split.dim / n * split.inner) * item, send.data());
        send_data = send.data();
      }
      Shape block_shape = x.shape();
      block_shape[static_cast<size_t>(dim_)] /= n;
      const Split3 concat = split_at(block_shape, concat_dim_);
      if (concat.outer == 1) {
        comm.all_to_all(device, group, send_data, result, block);
      } else {
        std::vector<char> received(x.nbytes());
        comm.all_to_all(device, group, send_data, received.data(), block);
        swap_block_axes(received.data(), n, concat.outer, static_cast<size_t>(concat.dim * concat.inner) * item,
                        result);
      }
      return;
    }

    case CollectiveKind::ShardSlice: {
      const Split3 s = split_at(x.shape(), dim_);
      const size_t row = static_cast<size_t>(s.dim * s.inner) * item;
      const size_t part = row / static_cast<size_t>(n);
      for (int64_t o = 0; o < s.outer; ++o)
        std::memcpy(result + static_cast<size_t>(o) * part, in + static_cast<size_t>(o) * row + index * part, part);
      return;
    }

    case CollectiveKind::ShardPad: {
      const Split3 s = split_at(x.shape(), dim_);
      const size_t part = static_cast<size_t>(s.dim * s.inner) * item;
      const size_t row = part * static_cast<size_t>(n);
      std::memset(result, 0, out.nbytes());  // all-zero bytes are 0 in every dtype
      for (int64_t o = 0; o < s.outer; ++o)
        std::memcpy(result + static_cast<size_t>(o) * row + index * part, in + static_cast<size_t>(o) * part, part);
      return;
    }
  }
}

// ---- builders ----

namespace {

int checked_dim(const Array& x, int dim, std::string_view op) { return normalize_axis(dim, x.ndim(), op); }

void check_divisible(const Array& x, int dim, int n, const Mesh& mesh, const std::vector<int>& axes,
                     std::string_view op) {
  if (x.shape()[static_cast<size_t>(dim)] % n != 0)
    fail<ShapeError>("{} over axes {} of mesh {} ({} devices): dim {} of {} has size {}, not divisible by {}", op,
                     mesh.axes_text(axes), mesh.to_string(), n, dim, type_string(x),
                     x.shape()[static_cast<size_t>(dim)], n);
}

void check_reducible(const Array& x, std::string_view op) {
  if (!is_reducible(x.dtype()))
    fail<DTypeError>("{}: cannot sum {} values (expected float32, float64, bfloat16, float16, int32 or int64)", op,
                     name(x.dtype()));
}

Array make(const Array& x, Shape shape, CollectiveKind kind, const Mesh& mesh, const std::vector<int>& axes, int dim,
           int concat = -1) {
  return Array::make(std::move(shape), x.dtype(), std::make_shared<Collective>(kind, mesh, axes, dim, concat), {x});
}

}  // namespace

Array all_gather(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int dim) {
  check_axes(mesh, axes, "all_gather");
  dim = checked_dim(x, dim, "all_gather");
  const int n = mesh.group_size(axes);
  if (n == 1) return x;
  Shape shape = x.shape();
  shape[static_cast<size_t>(dim)] *= n;
  return make(x, std::move(shape), CollectiveKind::AllGather, mesh, axes, dim);
}

Array all_reduce(const Array& x, const Mesh& mesh, const std::vector<int>& axes) {
  check_axes(mesh, axes, "all_reduce");
  check_reducible(x, "all_reduce");
  if (mesh.group_size(axes) == 1) return x;
  return make(x, x.shape(), CollectiveKind::AllReduce, mesh, axes, -1);
}

Array reduce_scatter(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int dim) {
  check_axes(mesh, axes, "reduce_scatter");
  check_reducible(x, "reduce_scatter");
  dim = checked_dim(x, dim, "reduce_scatter");
  const int n = mesh.group_size(axes);
  check_divisible(x, dim, n, mesh, axes, "reduce_scatter");
  if (n == 1) return x;
  Shape shape = x.shape();
  shape[static_cast<size_t>(dim)] /= n;
  return make(x, std::move(shape), CollectiveKind::ReduceScatter, mesh, axes, dim);
}

Array all_to_all(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int split_dim, int concat_dim) {
  check_axes(mesh, axes, "all_to_all");
  split_dim = checked_dim(x, split_dim, "all_to_all");
  concat_dim = checked_dim(x, concat_dim, "all_to_all");
  const int n = mesh.group_size(axes);
  check_divisible(x, split_dim, n, mesh, axes, "all_to_all");
  if (n == 1) return x;
  Shape shape = x.shape();
  shape[static_cast<size_t>(split_dim)] /= n;
  shape[static_cast<size_t>(concat_dim)] *= n;
  return make(x, std::move(shape), CollectiveKind::AllToAll, mesh, axes, split_dim, concat_dim);
}

Array shard_slice(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int dim) {
  check_axes(mesh, axes, "shard_slice");
  dim = checked_dim(x, dim, "shard_slice");
  const int n = mesh.group_size(axes);
  check_divisible(x, dim, n, mesh, axes, "shard_slice");
  if (n == 1) return x;
  Shape shape = x.shape();
  shape[static_cast<size_t>(dim)] /= n;
  return make(x, std::move(shape), CollectiveKind::ShardSlice, mesh, axes, dim);
}

Array shard_pad(const Array& x, const Mesh& mesh, const std::vector<int>& axes, int dim) {
  check_axes(mesh, axes, "shard_pad");
  dim = checked_dim(x, dim, "shard_pad");
  const int n = mesh.group_size(axes);
  if (n == 1) return x;
  Shape shape = x.shape();
  shape[static_cast<size_t>(dim)] *= n;
  return make(x, std::move(shape), CollectiveKind::ShardPad, mesh, axes, dim);
}

}  // namespace tessera::spmd
