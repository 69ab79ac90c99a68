// What every communicator shares: add_into and ordered_sum (the one elementwise sum and
// its order, so the in-process, MPI, TCP and NCCL reductions round identically), the
// group checks and the call statistics.
#include "tessera/spmd/communicator.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "spmd/communicator_local.h"
#include "tessera/base/error.h"

namespace tessera::spmd {
// Tiled so each tile of dst stays in cache while the members' contributions are added.
void ordered_sum(void* dst, const std::vector<const char*>& srcs, size_t count, DType dtype) {
  const size_t item = itemsize(dtype);
  constexpr size_t kTile = 4096;
  char* out = static_cast<char*>(dst);
  for (size_t begin = 0; begin < count; begin += kTile) {
    const size_t len = std::min(kTile, count - begin);
    std::memcpy(out + begin * item, srcs[0] + begin * item, len * item);
    for (size_t j = 1; j < srcs.size(); ++j) add_into(out + begin * item, srcs[j] + begin * item, len, dtype);
  }
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

void check_group_members(const char* op, int device, const std::vector<int>& group, int world,
                         const std::string& world_name) {
  if (group.empty()) fail<ValueError>("{}: empty group (device {})", op, device);
  std::vector<int> sorted = group;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    fail<ValueError>("{}: group {} lists a device twice", op, group);
  if (sorted.front() < 0 || sorted.back() >= world)
    fail<ValueError>("{}: group {} names a device outside 0..{} ({})", op, group, world - 1, world_name);
  if (std::find(group.begin(), group.end(), device) == group.end())
    fail<ValueError>("{}: device {} is not a member of group {}", op, device, group);
}

void record_call(CommStats& stats, CommKind kind, int n, double full_bytes, double seconds) {
  // A ring step sends 1/n of the buffer to the next member: n-1 steps for a gather,
  // scatter or all-to-all, 2(n-1) for an all-reduce (reduce-scatter + all-gather).
  const double ring = n > 1 ? static_cast<double>(n - 1) / n * full_bytes : 0.0;
  switch (kind) {
    case CommKind::AllGather:
      ++stats.all_gather_calls;
      stats.all_gather_bytes += ring;
      break;
    case CommKind::AllReduce:
      ++stats.all_reduce_calls;
      stats.all_reduce_bytes += 2 * ring;
      break;
    case CommKind::ReduceScatter:
      ++stats.reduce_scatter_calls;
      stats.reduce_scatter_bytes += ring;
      break;
    case CommKind::AllToAll:
      ++stats.all_to_all_calls;
      stats.all_to_all_bytes += ring;
      break;
    case CommKind::RaggedAllToAll:
      ++stats.all_to_all_calls;
      stats.all_to_all_bytes += full_bytes;
      break;
    case CommKind::Other:
      break;
  }
  stats.seconds += seconds;
}

RaggedBlocks ragged_blocks(const char* op, const std::vector<int>& group, size_t index,
                           const std::vector<size_t>& send_bytes, const std::vector<size_t>& recv_bytes) {
  const size_t n = group.size();
  if (send_bytes.size() != n || recv_bytes.size() != n)
    fail<ValueError>("{} on devices {}: {} send and {} receive block sizes (expected one per member: {})", op, group,
                     send_bytes.size(), recv_bytes.size(), n);
  RaggedBlocks b;
  b.send_offsets.resize(n);
  b.recv_offsets.resize(n);
  for (size_t j = 0; j < n; ++j) {
    b.send_offsets[j] = b.send_total;
    b.recv_offsets[j] = b.recv_total;
    b.send_total += send_bytes[j];
    b.recv_total += recv_bytes[j];
    if (j != index) b.sent_to_others += static_cast<double>(send_bytes[j]);
  }
  return b;
}

void Communicator::all_to_all_v(int device, const std::vector<int>& group, const void* send,
                                const std::vector<size_t>& send_bytes, void* recv,
                                const std::vector<size_t>& recv_bytes) {
  const size_t n = group.size();
  const size_t index = static_cast<size_t>(std::find(group.begin(), group.end(), device) - group.begin());
  const RaggedBlocks b = ragged_blocks("all_to_all_v", group, index, send_bytes, recv_bytes);
  // Every member's largest block, gathered, gives the common padded block size.
  const uint64_t largest = send_bytes.empty() ? 0 : *std::max_element(send_bytes.begin(), send_bytes.end());
  std::vector<uint64_t> largest_of(n);
  all_gather(device, group, &largest, largest_of.data(), sizeof(uint64_t));
  const auto block = static_cast<size_t>(*std::max_element(largest_of.begin(), largest_of.end()));
  std::vector<char> padded_send(n * block, 0), padded_recv(n * block);
  for (size_t j = 0; j < n; ++j)
    if (send_bytes[j] > 0)
      std::memcpy(padded_send.data() + j * block, static_cast<const char*>(send) + b.send_offsets[j], send_bytes[j]);
  all_to_all(device, group, padded_send.data(), padded_recv.data(), block);
  for (size_t k = 0; k < n; ++k)
    if (recv_bytes[k] > 0)
      std::memcpy(static_cast<char*>(recv) + b.recv_offsets[k], padded_recv.data() + k * block, recv_bytes[k]);
}

void Communicator::send(int device, int to, int tag, const void*, size_t) {
  fail<ValueError>(
      "send from device {} to device {} (tag {}): the {} communicator has no point-to-point messages (pipeline "
      "stages across processes need mpirun or a TCP job)",
      device, to, tag, kind());
}

void Communicator::recv(int device, int from, int tag, void*, size_t) {
  fail<ValueError>(
      "recv on device {} from device {} (tag {}): the {} communicator has no point-to-point messages (pipeline "
      "stages across processes need mpirun or a TCP job)",
      device, from, tag, kind());
}

void Communicator::wait_sends(int) {}

CommStats operator-(const CommStats& after, const CommStats& before) {
  CommStats d;
  d.all_gather_calls = after.all_gather_calls - before.all_gather_calls;
  d.all_reduce_calls = after.all_reduce_calls - before.all_reduce_calls;
  d.reduce_scatter_calls = after.reduce_scatter_calls - before.reduce_scatter_calls;
  d.all_to_all_calls = after.all_to_all_calls - before.all_to_all_calls;
  d.all_gather_bytes = after.all_gather_bytes - before.all_gather_bytes;
  d.all_reduce_bytes = after.all_reduce_bytes - before.all_reduce_bytes;
  d.reduce_scatter_bytes = after.reduce_scatter_bytes - before.reduce_scatter_bytes;
  d.all_to_all_bytes = after.all_to_all_bytes - before.all_to_all_bytes;
  d.seconds = after.seconds - before.seconds;
  return d;
}

CommStats operator+(const CommStats& a, const CommStats& b) {
  CommStats s;
  s.all_gather_calls = a.all_gather_calls + b.all_gather_calls;
  s.all_reduce_calls = a.all_reduce_calls + b.all_reduce_calls;
  s.reduce_scatter_calls = a.reduce_scatter_calls + b.reduce_scatter_calls;
  s.all_to_all_calls = a.all_to_all_calls + b.all_to_all_calls;
  s.all_gather_bytes = a.all_gather_bytes + b.all_gather_bytes;
  s.all_reduce_bytes = a.all_reduce_bytes + b.all_reduce_bytes;
  s.reduce_scatter_bytes = a.reduce_scatter_bytes + b.reduce_scatter_bytes;
  s.all_to_all_bytes = a.all_to_all_bytes + b.all_to_all_bytes;
  s.seconds = a.seconds + b.seconds;
  return s;
}

}  // namespace tessera::spmd
