// Lowering of the collective primitives to plan steps (see the header), and the host
// emulation that runs a plan with memcpy and a Communicator.
#include "tessera/spmd/collective_plan.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <mutex>

#include "spmd/block_layout.h"
#include "spmd/communicator_local.h"
#include "tessera/base/error.h"

namespace tessera::spmd {
namespace {

using Buffer = PlanRef::Buffer;

// Staging regions start 256-byte aligned (vector loads and device copies of any
// dtype stay aligned).
constexpr size_t kStagingAlignment = 256;

// split_at (block_layout.h) in unsigned byte arithmetic.
struct Extent {
  size_t outer, dim, inner;
};
Extent extent_at(const Shape& shape, int dim) {
  const Split3 s = split_at(shape, dim);
  return {static_cast<size_t>(s.outer), static_cast<size_t>(s.dim), static_cast<size_t>(s.inner)};
}

class PlanBuilder {
 public:
  explicit PlanBuilder(CollectivePlan& plan) : plan_(plan) {}

  // A new staging region of `bytes`.
  PlanRef stage(size_t bytes) {
    const size_t offset = (plan_.staging_bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
    plan_.staging_bytes = offset + bytes;
    return {Buffer::Staging, offset};
  }
  void copy(PlanRef src, PlanRef dst, size_t width, size_t rows = 1, size_t src_pitch = 0, size_t dst_pitch = 0) {
    PlanStep s;
    s.kind = PlanStep::Kind::Copy;
    s.src = src;
    s.dst = dst;
    s.width = width;
    s.rows = rows;
    s.src_pitch = rows > 1 ? src_pitch : width;
    s.dst_pitch = rows > 1 ? dst_pitch : width;
    plan_.steps.push_back(s);
  }
  void zero(PlanRef dst, size_t bytes) {
    PlanStep s;
    s.kind = PlanStep::Kind::Zero;
    s.dst = dst;
    s.width = bytes;
    plan_.steps.push_back(s);
  }
  void exchange(PlanStep::Kind kind, PlanRef src, PlanRef dst, size_t block) {
    PlanStep s;
    s.kind = kind;
    s.src = src;
    s.dst = dst;
    s.width = block;
    plan_.steps.push_back(s);
  }
  void ordered_sum(PlanRef src, PlanRef dst, size_t count, size_t stride) {
    PlanStep s;
    s.kind = PlanStep::Kind::OrderedSum;
    s.src = src;
    s.dst = dst;
    s.count = count;
    s.stride = stride;
    s.members = plan_.members;
    plan_.steps.push_back(s);
  }
  // [n][outer][row] at src -> [outer][n][row] at dst: one strided copy per member.
  void members_inward(PlanRef src, PlanRef dst, size_t outer, size_t row) {
    const size_t n = static_cast<size_t>(plan_.members);
    for (size_t k = 0; k < n; ++k)
      copy({src.buffer, src.offset + k * outer * row}, {dst.buffer, dst.offset + k * row}, row, outer, row, n * row);
  }
  // [outer][n][row] at src -> [n][outer][row] at dst.
  void members_outward(PlanRef src, PlanRef dst, size_t outer, size_t row) {
    const size_t n = static_cast<size_t>(plan_.members);
    for (size_t k = 0; k < n; ++k)
      copy({src.buffer, src.offset + k * row}, {dst.buffer, dst.offset + k * outer * row}, row, outer, n * row, row);
  }

 private:
  CollectivePlan& plan_;
};

}  // namespace

std::string CollectivePlan::to_string() const {
  std::string text = fmt::format("{} over {}:", spmd::to_string(kind), members);
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& s = steps[i];
    text += i ? ", " : " ";
    switch (s.kind) {
      case PlanStep::Kind::Copy:
        text += s.rows > 1 ? fmt::format("copy {} B x{}", s.width, s.rows) : fmt::format("copy {} B", s.width);
        break;
      case PlanStep::Kind::Zero:
        text += fmt::format("zero {} B", s.width);
        break;
      case PlanStep::Kind::AllGather:
        text += fmt::format("all_gather {} B", s.width);
        break;
      case PlanStep::Kind::AllToAll:
        text += fmt::format("all_to_all {} B", s.width);
        break;
      case PlanStep::Kind::OrderedSum:
        text += fmt::format("ordered_sum {} x{}", s.count, s.members);
        break;
    }
  }
  return text;
}

CollectivePlan plan_collective(const Collective& collective, const Shape& input_shape, DType dtype, int64_t index) {
  CollectivePlan plan;
  plan.kind = collective.kind();
  plan.dtype = dtype;
  plan.members = collective.group_size();
  const size_t n = static_cast<size_t>(plan.members);
  const size_t item = itemsize(dtype);
  const size_t count = static_cast<size_t>(numel(input_shape));
  plan.input_bytes = count * item;
  const int dim = collective.dim();
  if (index < 0 || index >= plan.members)
    fail<ValueError>("{} {{{}}}: member index {} is outside the group of {}", collective.name(),
                     collective.attributes(), index, plan.members);
  if (dim >= static_cast<int>(input_shape.size()) || collective.concat_dim() >= static_cast<int>(input_shape.size()))
    fail<ShapeError>("{} {{{}}}: dims out of range for a local input of shape {}", collective.name(),
                     collective.attributes(), tessera::to_string(input_shape));
  auto divisible = [&](int d) {
    if (input_shape[static_cast<size_t>(d)] % plan.members != 0)
      fail<ShapeError>("{} {{{}}}: dim {} of shape {} is not divisible by the group's {} members", collective.name(),
                       collective.attributes(), d, tessera::to_string(input_shape), plan.members);
  };
  switch (plan.kind) {
    case CollectiveKind::AllGather:
    case CollectiveKind::ShardPad:
      plan.output_bytes = plan.input_bytes * n;
      break;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::ShardSlice:
      divisible(dim);
      plan.output_bytes = plan.input_bytes / n;
      break;
    case CollectiveKind::AllToAll:
      divisible(dim);
      plan.output_bytes = plan.input_bytes;
      break;
    case CollectiveKind::AllReduce:
      plan.output_bytes = plan.input_bytes;
      break;
  }
  if (plan.input_bytes == 0 || plan.output_bytes == 0) return plan;
  const PlanRef input{Buffer::Input, 0}, output{Buffer::Output, 0};
  PlanBuilder b(plan);
  const size_t at = static_cast<size_t>(index);

  switch (plan.kind) {
    case CollectiveKind::AllGather: {
      const Extent s = extent_at(input_shape, dim);
      if (s.outer == 1) {
        b.exchange(PlanStep::Kind::AllGather, input, output, plan.input_bytes);
      } else {
        const PlanRef gathered = b.stage(plan.output_bytes);
        b.exchange(PlanStep::Kind::AllGather, input, gathered, plan.input_bytes);
        b.members_inward(gathered, output, s.outer, s.dim * s.inner * item);
      }
      break;
    }
    case CollectiveKind::ReduceScatter: {
      const Extent s = extent_at(input_shape, dim);
      const size_t out_count = count / n;
      PlanRef blocks = input;
      if (s.outer > 1) {
        blocks = b.stage(plan.input_bytes);
        b.members_outward(input, blocks, s.outer, s.dim / n * s.inner * item);
      }
      const PlanRef received = b.stage(plan.input_bytes);
      b.exchange(PlanStep::Kind::AllToAll, blocks, received, out_count * item);
      b.ordered_sum(received, output, out_count, out_count);
      break;
    }
    case CollectiveKind::AllReduce: {
      // A reduce-scatter of the buffer padded to n equal chunks, then an all-gather of
      // the chunks' sums.
      const size_t chunk = (count + n - 1) / n;
      const bool exact = chunk * n == count;
      PlanRef padded = input;
      if (!exact) {
        padded = b.stage(chunk * n * item);
        b.copy(input, padded, plan.input_bytes);
        b.zero({padded.buffer, padded.offset + plan.input_bytes}, (chunk * n - count) * item);
      }
      const PlanRef received = b.stage(chunk * n * item);
      b.exchange(PlanStep::Kind::AllToAll, padded, received, chunk * item);
      const PlanRef sum = b.stage(chunk * item);
      b.ordered_sum(received, sum, chunk, chunk);
      if (exact) {
        b.exchange(PlanStep::Kind::AllGather, sum, output, chunk * item);
      } else {
        const PlanRef gathered = b.stage(chunk * n * item);
        b.exchange(PlanStep::Kind::AllGather, sum, gathered, chunk * item);
        b.copy(gathered, output, plan.output_bytes);
      }
      break;
    }
    case CollectiveKind::AllToAll: {
      // Send block j along the split dim to member j; receive member k's block along
      // the concat dim, in group order.
      const int concat_dim = collective.concat_dim();
      const Extent split = extent_at(input_shape, dim);
      const size_t block = plan.input_bytes / n;
      PlanRef send = input;
      if (split.outer > 1) {
        send = b.stage(plan.input_bytes);
        b.members_outward(input, send, split.outer, split.dim / n * split.inner * item);
      }
      Shape block_shape = input_shape;
      block_shape[static_cast<size_t>(dim)] /= plan.members;
      const Extent concat = extent_at(block_shape, concat_dim);
      if (concat.outer == 1) {
        b.exchange(PlanStep::Kind::AllToAll, send, output, block);
      } else {
        const PlanRef received = b.stage(plan.input_bytes);
        b.exchange(PlanStep::Kind::AllToAll, send, received, block);
        b.members_inward(received, output, concat.outer, concat.dim * concat.inner * item);
      }
      break;
    }
    case CollectiveKind::ShardSlice: {
      const Extent s = extent_at(input_shape, dim);
      const size_t row = s.dim * s.inner * item, part = row / n;
      b.copy({Buffer::Input, at * part}, output, part, s.outer, row, part);
      break;
    }
    case CollectiveKind::ShardPad: {
      const Extent s = extent_at(input_shape, dim);
      const size_t part = s.dim * s.inner * item, row = part * n;
      b.zero(output, plan.output_bytes);
      b.copy(input, {Buffer::Output, at * part}, part, s.outer, part, row);
      break;
    }
  }
  return plan;
}

void run_collective_plan(const CollectivePlan& plan, const void* input, void* output, void* staging, Communicator& comm,
                         int device, const std::vector<int>& group) {
  if (static_cast<int>(group.size()) != plan.members)
    fail<ValueError>("{}: the group has {} members but the plan was made for {}", plan.to_string(), group.size(),
                     plan.members);
  auto at = [&](const PlanRef& ref) -> char* {
    switch (ref.buffer) {
      case Buffer::Input:
        return const_cast<char*>(static_cast<const char*>(input)) + ref.offset;
      case Buffer::Output:
        return static_cast<char*>(output) + ref.offset;
      case Buffer::Staging:
        return static_cast<char*>(staging) + ref.offset;
    }
    return nullptr;
  };
  for (const PlanStep& s : plan.steps) {
    switch (s.kind) {
      case PlanStep::Kind::Copy:
        for (size_t r = 0; r < s.rows; ++r)
          std::memcpy(at(s.dst) + r * s.dst_pitch, at(s.src) + r * s.src_pitch, s.width);
        break;
      case PlanStep::Kind::Zero:
        std::memset(at(s.dst), 0, s.width);
        break;
      case PlanStep::Kind::AllGather:
        comm.all_gather(device, group, at(s.src), at(s.dst), s.width);
        break;
      case PlanStep::Kind::AllToAll:
        comm.all_to_all(device, group, at(s.src), at(s.dst), s.width);
        break;
      case PlanStep::Kind::OrderedSum: {
        const size_t item = itemsize(plan.dtype);
        std::vector<const char*> blocks;
        for (int k = 0; k < s.members; ++k) blocks.push_back(at(s.src) + static_cast<size_t>(k) * s.stride * item);
        ordered_sum(at(s.dst), blocks, s.count, plan.dtype);
        break;
      }
    }
  }
}

namespace {
struct DeviceCollectiveStats {
  std::mutex mutex;
  std::map<int, CommStats> by_device;
};
DeviceCollectiveStats& device_stats() {
  static DeviceCollectiveStats s;
  return s;
}
}  // namespace

void record_device_collective(int device, const CollectivePlan& plan) {
  CommKind kind = CommKind::Other;
  double full = static_cast<double>(plan.input_bytes);
  switch (plan.kind) {
    case CollectiveKind::AllGather:
      kind = CommKind::AllGather;
      full = static_cast<double>(plan.output_bytes);  // the gathered buffer
      break;
    case CollectiveKind::AllReduce:
      kind = CommKind::AllReduce;
      break;
    case CollectiveKind::ReduceScatter:
      kind = CommKind::ReduceScatter;
      break;
    case CollectiveKind::AllToAll:
      kind = CommKind::AllToAll;
      break;
    case CollectiveKind::ShardSlice:
    case CollectiveKind::ShardPad:
      return;  // local copies: nothing communicated
  }
  DeviceCollectiveStats& s = device_stats();
  std::lock_guard<std::mutex> lock(s.mutex);
  record_call(s.by_device[device], kind, plan.members, full, 0.0);
}

CommStats device_collective_stats(int device) {
  DeviceCollectiveStats& s = device_stats();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.by_device.find(device);
  return it == s.by_device.end() ? CommStats{} : it->second;
}

}  // namespace tessera::spmd
