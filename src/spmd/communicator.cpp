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
namespace {

template <typename T>
void add_native(void* dst, const void* src, size_t count) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] + s[i]);
}

// 16-bit floats add in float32 and the sum is rounded back to 16 bits after every
// addition: the sum "in the element's own dtype", which every backend reproduces.
template <typename H, float (*ToFloat)(H), H (*FromFloat)(float)>
void add_half(void* dst, const void* src, size_t count) {
  H* d = static_cast<H*>(dst);
  const H* s = static_cast<const H*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = FromFloat(ToFloat(d[i]) + ToFloat(s[i]));
}

// Integer sums wrap modulo 2^bits (two's complement), like numpy; computed unsigned
// so overflow is defined.
template <typename T, typename U>
void add_wrapping(void* dst, const void* src, size_t count) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(static_cast<U>(d[i]) + static_cast<U>(s[i]));
}

}  // namespace

void add_into(void* dst, const void* src, size_t count, DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return add_native<float>(dst, src, count);
    case DType::Float64:
      return add_native<double>(dst, src, count);
    case DType::BFloat16:
      return add_half<bfloat16, bf16_to_float, float_to_bf16>(dst, src, count);
    case DType::Float16:
      return add_half<float16, f16_to_float, float_to_f16>(dst, src, count);
    case DType::Int32:
      return add_wrapping<int32_t, uint32_t>(dst, src, count);
    case DType::Int64:
      return add_wrapping<int64_t, uint64_t>(dst, src, count);
    default:
      fail<DTypeError>("add_into: cannot sum {} values (expected float32, float64, bfloat16, float16, int32 or int64)",
                       name(dtype));
  }
}

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
    case CommKind::Other:
      break;
  }
  stats.seconds += seconds;
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

}  // namespace tessera::spmd
