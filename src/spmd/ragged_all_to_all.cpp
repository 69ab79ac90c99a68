// The ragged all-to-all (spmd/ragged_all_to_all.h): builders, attributes, vjp, cost and
// the exchange itself, which packs each member's rows per destination, moves them with
// Communicator::all_to_all_v and unpacks them into zero-filled rows.
#include "tessera/spmd/ragged_all_to_all.h"

#include <fmt/format.h>

#include <cstring>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/spmd/runtime.h"

namespace tessera::spmd {

namespace {

void check_sizes(const char* op, const Array& sizes, int64_t rows, int members) {
  if (sizes.dtype() != DType::Int32 && sizes.dtype() != DType::Int64)
    fail<DTypeError>("{}: expert sizes of dtype {} (expected int32 or int64)", op, name(sizes.dtype()));
  if (sizes.ndim() != 2 || sizes.shape(0) != rows || sizes.shape(1) % members != 0)
    fail<ShapeError>("{}: expert sizes {} (expected [{}, experts] with the experts divisible by the {} members)", op,
                     to_string(sizes.shape()), rows, members);
}

}  // namespace

RaggedAllToAll::RaggedAllToAll(bool combine, Mesh mesh, std::vector<int> axes)
    : combine_(combine), mesh_(std::move(mesh)), axes_(std::move(axes)) {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i] < 0 || axes_[i] >= mesh_.ndim())
      fail<AxisError>("ragged_all_to_all: mesh axis {} is out of range for mesh {}", axes_[i], mesh_.to_string());
}

std::string RaggedAllToAll::attributes() const {
  return fmt::format("axes={}, combine={}, mesh={}", mesh_.axes_text(axes_), combine_ ? "true" : "false",
                     mesh_.to_string());
}

Array ragged_dispatch(const Array& x, const Array& sizes, const Mesh& mesh, const std::vector<int>& axes) {
  const int members = mesh.group_size(axes);
  if (x.ndim() != 3) fail<ShapeError>("ragged_dispatch: x {} (expected [groups, rows, width])", to_string(x.shape()));
  check_sizes("ragged_dispatch", sizes, x.shape(0) * members, members);
  return Array::make({1, x.shape(0) * members, x.shape(1), x.shape(2)}, x.dtype(),
                     std::make_shared<RaggedAllToAll>(false, mesh, axes), {x, sizes});
}

Array ragged_combine(const Array& y, const Array& sizes, const Mesh& mesh, const std::vector<int>& axes) {
  const int members = mesh.group_size(axes);
  if (y.ndim() != 4 || y.shape(0) != 1 || y.shape(1) % members != 0)
    fail<ShapeError>("ragged_combine: y {} (expected [1, members x groups, rows, width] with {} members)",
                     to_string(y.shape()), members);
  check_sizes("ragged_combine", sizes, y.shape(1), members);
  return Array::make({y.shape(1) / members, y.shape(2), y.shape(3)}, y.dtype(),
                     std::make_shared<RaggedAllToAll>(true, mesh, axes), {y, sizes});
}

std::vector<Array> RaggedAllToAll::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                       const std::vector<int>& argnums, const std::vector<Array>&) {
  const Array& sizes = primals[1];
  std::vector<Array> result;
  for (int arg : argnums) {
    if (arg == 0)
      result.push_back(combine_ ? ragged_dispatch(cotangents[0], sizes, mesh_, axes_)
                                : ragged_combine(cotangents[0], sizes, mesh_, axes_));
    else
      result.push_back(zeros(sizes.shape(), sizes.dtype()));
  }
  return result;
}

double RaggedAllToAll::planned_bytes(double groups_bytes) const {
  const double n = group_size();
  return (n - 1) / n * groups_bytes;
}

Cost RaggedAllToAll::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  return {0, planned_bytes(static_cast<double>((combine_ ? outputs[0] : inputs[0]).nbytes()))};
}

void ragged_exchange(const RaggedAllToAll& op, const std::vector<int64_t>& sizes, int64_t experts, int64_t groups,
                     int64_t rows, size_t row_bytes, const char* in, char* out, Communicator* comm, int device) {
  const int64_t members = op.group_size(), per_member = experts / members;
  const int64_t me = members == 1 ? 0 : op.mesh().index_in_group(device, op.axes());
  // cnt(t, j, q) and off(t, j, q) of the header, checked against the rows per group.
  auto at = [&](int64_t t, int64_t j) { return &sizes[static_cast<size_t>((t * groups + j) * experts)]; };
  std::vector<int64_t> cnt(static_cast<size_t>(members * groups * members)), off(cnt.size());
  for (int64_t t = 0; t < members; ++t)
    for (int64_t j = 0; j < groups; ++j) {
      const int64_t* s = at(t, j);
      int64_t start = 0;
      for (int64_t q = 0; q < members; ++q) {
        int64_t c = 0;
        for (int64_t e = q * per_member; e < (q + 1) * per_member; ++e) {
          if (s[e] < 0)
            fail<ValueError>("{}: expert {} of group {} on member {} has {} rows (expected >= 0)", op.name(), e, j, t,
                             s[e]);
          c += s[e];
        }
        const size_t i = static_cast<size_t>((t * groups + j) * members + q);
        cnt[i] = c;
        off[i] = start;
        start += c;
      }
      if (start > rows)
        fail<ValueError>("{}: group {} on member {} routes {} rows, but a group holds {}", op.name(), j, t, start,
                         rows);
    }
  auto count = [&](int64_t t, int64_t j, int64_t q) {
    return cnt[static_cast<size_t>((t * groups + j) * members + q)];
  };
  auto offset = [&](int64_t t, int64_t j, int64_t q) {
    return off[static_cast<size_t>((t * groups + j) * members + q)];
  };

  // Dispatch: this member's group j sends member q its rows for q's experts; member t's
  // group j lands in output group t Gl + j. Combine runs the same blocks backwards.
  std::vector<size_t> send_bytes(static_cast<size_t>(members)), recv_bytes(send_bytes.size());
  for (int64_t q = 0; q < members; ++q)
    for (int64_t j = 0; j < groups; ++j) {
      const auto to = static_cast<size_t>(op.combine() ? count(q, j, me) : count(me, j, q)) * row_bytes;
      const auto from = static_cast<size_t>(op.combine() ? count(me, j, q) : count(q, j, me)) * row_bytes;
      send_bytes[static_cast<size_t>(q)] += to;
      recv_bytes[static_cast<size_t>(q)] += from;
    }
  size_t send_total = 0, recv_total = 0;
  for (int64_t q = 0; q < members; ++q) {
    send_total += send_bytes[static_cast<size_t>(q)];
    recv_total += recv_bytes[static_cast<size_t>(q)];
  }
  const size_t group_bytes = static_cast<size_t>(rows) * row_bytes;
  std::vector<char> send(send_total), recv(recv_total);
  size_t at_byte = 0;
  for (int64_t q = 0; q < members; ++q)
    for (int64_t j = 0; j < groups; ++j) {
      // dispatch: x[j] from row off(me, j, q); combine: y[0, q Gl + j] from row 0.
      const int64_t n = op.combine() ? count(q, j, me) : count(me, j, q);
      const char* src =
          op.combine() ? in + static_cast<size_t>(q * groups + j) * group_bytes
                       : in + static_cast<size_t>(j) * group_bytes + static_cast<size_t>(offset(me, j, q)) * row_bytes;
      const size_t bytes = static_cast<size_t>(n) * row_bytes;
      if (bytes > 0) std::memcpy(send.data() + at_byte, src, bytes);
      at_byte += bytes;
    }
  if (members == 1) {
    recv.swap(send);
  } else {
    if (comm == nullptr)
      fail<ValueError>(
          "{} {{{}}}: runs over {} devices but no device is current (evaluate it inside "
          "spmd::run_on_devices, e.g. through a jitted sharded function)",
          op.name(), op.attributes(), members);
    comm->all_to_all_v(device, op.mesh().group(device, op.axes()), send.data(), send_bytes, recv.data(), recv_bytes);
  }
  const int64_t out_groups = op.combine() ? groups : members * groups;
  std::memset(out, 0, static_cast<size_t>(out_groups) * group_bytes);
  at_byte = 0;
  for (int64_t t = 0; t < members; ++t)
    for (int64_t j = 0; j < groups; ++j) {
      // dispatch: member t's group j -> out[0, t Gl + j] from row 0; combine: back into
      // out[j] at row off(me, j, t).
      const int64_t n = op.combine() ? count(me, j, t) : count(t, j, me);
      char* dst = op.combine()
                      ? out + static_cast<size_t>(j) * group_bytes + static_cast<size_t>(offset(me, j, t)) * row_bytes
                      : out + static_cast<size_t>(t * groups + j) * group_bytes;
      const size_t bytes = static_cast<size_t>(n) * row_bytes;
      if (bytes > 0) std::memcpy(dst, recv.data() + at_byte, bytes);
      at_byte += bytes;
    }
}

void RaggedAllToAll::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  const Array& groups_side = combine_ ? out : x;  // [Gl, N, D]
  const int64_t members = group_size(), groups = groups_side.shape(0), rows = groups_side.shape(1);
  const size_t row_bytes = static_cast<size_t>(groups_side.shape(2)) * x.itemsize();
  const DeviceContext* context = current_device();
  if (context != nullptr && context->device >= mesh_.size())
    fail<ValueError>("{} {{{}}}: device {} is not in mesh {} ({} devices)", name(), attributes(), context->device,
                     mesh_.to_string(), mesh_.size());
  if (members > 1 && context == nullptr)
    fail<ValueError>(
        "{} {{{}}}: runs over {} devices but no device is current (evaluate it inside "
        "spmd::run_on_devices, e.g. through a jitted sharded function)",
        name(), attributes(), members);
  ragged_exchange(*this, inputs[1].to_vector<int64_t>(), inputs[1].shape(1), groups, rows, row_bytes,
                  static_cast<const char*>(x.raw_data()), static_cast<char*>(out.mutable_raw_data()),
                  context ? context->communicator : nullptr, context ? context->device : 0);
}

}  // namespace tessera::spmd
