// The in-process communicator: N virtual devices in one process, one thread each.
// See communicator_local.h for the rendezvous protocol.
#include "spmd/communicator_local.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "tessera/base/error.h"

namespace tessera::spmd {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// memcpy that accepts empty copies of null pointers (zero-size arrays).
void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

// Per-thread staging buffer (grown, never shrunk) for members whose output overlaps
// their input.
void* scratch(size_t bytes, int which) {
  thread_local std::vector<char> buffers[2];
  std::vector<char>& b = buffers[which];
  if (b.size() < bytes) b.resize(bytes);
  return b.data();
}

std::string describe(const LocalCommunicator::Slot& s) {
  if (s.reduction) return fmt::format("{} of {} {} elements", s.op, s.size, name(s.dtype));
  return fmt::format("{} of {} bytes", s.op, s.size);
}

void check_reducible(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32:
    case DType::Float64:
    case DType::BFloat16:
    case DType::Float16:
    case DType::Int32:
    case DType::Int64:
      return;
    default:
      fail<DTypeError>("{}: cannot sum {} values (expected float32, float64, bfloat16, float16, int32 or int64)", op,
                       name(dtype));
  }
}

}  // namespace

LocalCommunicator::LocalCommunicator(int devices) : devices_(devices), stats_(static_cast<size_t>(devices)) {
  if (devices < 1) fail<ValueError>("local communicator: {} devices (expected at least 1)", devices);
}

std::vector<int> LocalCommunicator::local_devices() const {
  std::vector<int> out(static_cast<size_t>(devices_));
  for (int d = 0; d < devices_; ++d) out[static_cast<size_t>(d)] = d;
  return out;
}

void LocalCommunicator::begin_run(const std::vector<int>& devices) {
  std::lock_guard<std::mutex> lock(mutex_);
  running_.resize(static_cast<size_t>(devices_));
  for (int d : devices) ++running_.at(static_cast<size_t>(d));
  ++runs_;
}

void LocalCommunicator::end_run(const std::vector<int>& devices) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int d : devices) --running_.at(static_cast<size_t>(d));
  --runs_;
}

void LocalCommunicator::check_group(int device, const std::vector<int>& group, const char* op) const {
  check_group_members(op, device, group, devices_, fmt::format("the local world has {} devices", devices_));
  std::lock_guard<std::mutex> lock(mutex_);
  if (runs_ == 0) return;
  for (int d : group)
    if (running_[static_cast<size_t>(d)] == 0)
      fail<ValueError>(
          "{}: group {} includes device {}, which is not running in this run_on_devices call (it would wait forever)",
          op, group, d);
}

void LocalCommunicator::throw_aborted(const char* op, const std::vector<int>& group) const {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reason = reason_;
  }
  fail<Error>("{} on devices {}: aborted: {}", op, group, reason);
}

LocalCommunicator::Call LocalCommunicator::enter(int device, const std::vector<int>& group, const Slot& mine) {
  Call call;
  call.start = now_seconds();
  if (aborted_.load()) throw_aborted(mine.op, group);
  check_group(device, group, mine.op);
  call.group = &group;
  call.device = device;
  call.n = static_cast<int>(group.size());
  call.index = static_cast<int>(std::find(group.begin(), group.end(), device) - group.begin());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<Rendezvous>& r = groups_[group];
    if (!r) r = std::make_unique<Rendezvous>(group.size());
    call.rendezvous = r.get();
  }
  {
    // Posting happens under the rendezvous lock before arriving, so the barrier
    // publishes it to every member.
    std::lock_guard<std::mutex> lock(call.rendezvous->mutex);
    call.rendezvous->slots[static_cast<size_t>(call.index)] = mine;
  }
  sync(call);
  // Every member runs the same check on the same slots, so they all throw together.
  const std::vector<Slot>& slots = call.rendezvous->slots;
  for (int j = 1; j < call.n; ++j) {
    const Slot& a = slots[0];
    const Slot& b = slots[static_cast<size_t>(j)];
    if (std::strcmp(a.op, b.op) != 0 || a.size != b.size || a.dtype != b.dtype || a.reduction != b.reduction)
      fail<ValueError>("{} on devices {}: members disagree: device {} called {}, device {} called {}", mine.op, group,
                       group[0], describe(a), group[static_cast<size_t>(j)], describe(b));
  }
  return call;
}

void LocalCommunicator::sync(const Call& call) {
  Rendezvous& r = *call.rendezvous;
  std::unique_lock<std::mutex> lock(r.mutex);
  if (aborted_.load()) {
    lock.unlock();
    throw_aborted(r.slots[static_cast<size_t>(call.index)].op, *call.group);
  }
  const uint64_t generation = r.generation;
  if (++r.arrived == call.n) {
    r.arrived = 0;
    ++r.generation;
    r.cv.notify_all();
    return;
  }
  r.cv.wait(lock, [&] { return r.generation != generation || aborted_.load(); });
  if (r.generation == generation) {  // woken by abort()
    lock.unlock();
    throw_aborted(r.slots[static_cast<size_t>(call.index)].op, *call.group);
  }
}

void LocalCommunicator::leave(const Call& call, CommKind kind, double full_bytes) {
  sync(call);
  const double seconds = now_seconds() - call.start;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  record_call(stats_[static_cast<size_t>(call.device)], kind, call.n, full_bytes, seconds);
}

void LocalCommunicator::all_gather(int device, const std::vector<int>& group, const void* send, void* recv,
                                   size_t bytes) {
  const size_t n = group.size();
  // An output overlapping the input anywhere but at this member's own block would be
  // overwritten while others read it: such members gather into scratch first.
  Slot mine{.op = "all_gather", .size = bytes, .send = send, .recv = recv};
  const size_t own = static_cast<size_t>(std::find(group.begin(), group.end(), device) - group.begin());
  const bool own_block = own < n && send == static_cast<char*>(recv) + own * bytes;
  const bool staged = !own_block && overlaps(send, bytes, recv, n * bytes);
  Call call = enter(device, group, mine);
  char* out = static_cast<char*>(staged ? scratch(n * bytes, 0) : recv);
  for (int j = 0; j < call.n; ++j) {
    if (j == call.index && own_block) continue;
    copy_bytes(out + static_cast<size_t>(j) * bytes, call.rendezvous->slots[static_cast<size_t>(j)].send, bytes);
  }
  leave(call, CommKind::AllGather, static_cast<double>(n * bytes));
  if (staged) copy_bytes(recv, out, n * bytes);
}

void LocalCommunicator::reduce_scatter(int device, const std::vector<int>& group, const void* send, void* recv,
                                       size_t count, DType dtype) {
  check_reducible(dtype, "reduce_scatter");
  const size_t n = group.size(), block = count * itemsize(dtype);
  const bool staged = overlaps(send, n * block, recv, block);
  Slot mine{.op = "reduce_scatter", .size = count, .dtype = dtype, .reduction = true, .send = send, .recv = recv};
  Call call = enter(device, group, mine);
  std::vector<const char*> srcs(n);
  for (size_t j = 0; j < n; ++j)
    srcs[j] = static_cast<const char*>(call.rendezvous->slots[j].send) + static_cast<size_t>(call.index) * block;
  void* out = staged ? scratch(block, 0) : recv;
  ordered_sum(out, srcs, count, dtype);
  leave(call, CommKind::ReduceScatter, static_cast<double>(n * block));
  if (staged) copy_bytes(recv, out, block);
}

void LocalCommunicator::all_reduce(int device, const std::vector<int>& group, const void* send, void* recv,
                                   size_t count, DType dtype) {
  check_reducible(dtype, "all_reduce");
  // Member i sums chunk i of the elements (a reduce-scatter) and hands it to every
  // member (an all-gather). When no member reduces in place, the chunk goes straight
  // into every member's output; otherwise into the member's scratch, which the others
  // copy after a barrier (by then nobody reads an input any more).
  const size_t n = group.size(), item = itemsize(dtype);
  const size_t chunk = (count + n - 1) / n;
  Slot mine{.op = "all_reduce", .size = count, .dtype = dtype, .reduction = true, .send = send, .recv = recv};
  mine.in_place = overlaps(send, count * item, recv, count * item);
  mine.scratch = scratch(chunk * item, 1);
  Call call = enter(device, group, mine);
  const std::vector<Slot>& slots = call.rendezvous->slots;
  const bool any_in_place = std::any_of(slots.begin(), slots.end(), [](const Slot& s) { return s.in_place; });
  auto range = [&](size_t i) {
    const size_t lo = std::min(count, i * chunk);
    return std::pair<size_t, size_t>{lo, std::min(count, lo + chunk)};
  };
  const auto [lo, hi] = range(static_cast<size_t>(call.index));
  std::vector<const char*> srcs(n);
  for (size_t j = 0; j < n; ++j) srcs[j] = static_cast<const char*>(slots[j].send) + lo * item;
  if (!any_in_place) {
    char* mine_out = static_cast<char*>(recv) + lo * item;
    ordered_sum(mine_out, srcs, hi - lo, dtype);
    for (size_t j = 0; j < n; ++j)
      if (j != static_cast<size_t>(call.index) && hi > lo)
        copy_bytes(static_cast<char*>(slots[j].recv) + lo * item, mine_out, (hi - lo) * item);
  } else {
    ordered_sum(mine.scratch, srcs, hi - lo, dtype);
    sync(call);
    for (size_t j = 0; j < n; ++j) {
      const auto [jlo, jhi] = range(j);
      if (jhi > jlo) copy_bytes(static_cast<char*>(recv) + jlo * item, slots[j].scratch, (jhi - jlo) * item);
    }
  }
  leave(call, CommKind::AllReduce, static_cast<double>(count * item));
}

void LocalCommunicator::all_to_all(int device, const std::vector<int>& group, const void* send, void* recv,
                                   size_t bytes) {
  const size_t n = group.size();
  const bool staged = overlaps(send, n * bytes, recv, n * bytes);
  Slot mine{.op = "all_to_all", .size = bytes, .send = send, .recv = recv};
  Call call = enter(device, group, mine);
  char* out = static_cast<char*>(staged ? scratch(n * bytes, 0) : recv);
  for (size_t j = 0; j < n; ++j)
    copy_bytes(out + j * bytes,
               static_cast<const char*>(call.rendezvous->slots[j].send) + static_cast<size_t>(call.index) * bytes,
               bytes);
  leave(call, CommKind::AllToAll, static_cast<double>(n * bytes));
  if (staged) copy_bytes(recv, out, n * bytes);
}

void LocalCommunicator::all_to_all_v(int device, const std::vector<int>& group, const void* send,
                                     const std::vector<size_t>& send_bytes, void* recv,
                                     const std::vector<size_t>& recv_bytes) {
  const size_t n = group.size();
  const size_t own = static_cast<size_t>(std::find(group.begin(), group.end(), device) - group.begin());
  const RaggedBlocks b = ragged_blocks("all_to_all_v", group, own, send_bytes, recv_bytes);
  const bool staged = overlaps(send, b.send_total, recv, b.recv_total);
  Slot mine{.op = "all_to_all_v", .size = n, .send = send, .recv = recv, .blocks = send_bytes.data()};
  Call call = enter(device, group, mine);
  char* out = static_cast<char*>(staged ? scratch(b.recv_total, 0) : recv);
  // Member j's block for this member starts after its blocks for members 0 .. index-1.
  const auto index = static_cast<size_t>(call.index);
  std::string mismatch;
  for (size_t j = 0; j < n; ++j) {
    const Slot& theirs = call.rendezvous->slots[j];
    size_t offset = 0;
    for (size_t i = 0; i < index; ++i) offset += theirs.blocks[i];
    if (theirs.blocks[index] != recv_bytes[j]) {
      mismatch = fmt::format("device {} sends {} bytes to device {}, which expects {}", group[j], theirs.blocks[index],
                             device, recv_bytes[j]);
      break;
    }
    copy_bytes(out + b.recv_offsets[j], static_cast<const char*>(theirs.send) + offset, recv_bytes[j]);
  }
  leave(call, CommKind::RaggedAllToAll, b.sent_to_others);
  if (!mismatch.empty()) fail<ValueError>("all_to_all_v on devices {}: {}", group, mismatch);
  if (staged) copy_bytes(recv, out, b.recv_total);
}

void LocalCommunicator::broadcast(int device, const std::vector<int>& group, void* buffer, size_t bytes) {
  Slot mine{.op = "broadcast", .size = bytes, .send = buffer, .recv = buffer};
  Call call = enter(device, group, mine);
  if (call.index != 0 && bytes > 0) copy_bytes(buffer, call.rendezvous->slots[0].send, bytes);
  leave(call, CommKind::Other, 0);
}

void LocalCommunicator::barrier(int device, const std::vector<int>& group) {
  Slot mine{.op = "barrier"};
  Call call = enter(device, group, mine);
  leave(call, CommKind::Other, 0);
}

void LocalCommunicator::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_.load()) return;  // the first reason is the one reported
  reason_ = reason;
  aborted_.store(true);
  // Taking each rendezvous lock before notifying means no waiter can miss the flag
  // between testing it and going to sleep.
  for (auto& [group, r] : groups_) {
    std::lock_guard<std::mutex> guard(r->mutex);
    r->cv.notify_all();
  }
}

void LocalCommunicator::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_.store(false);
  reason_.clear();
  groups_.clear();  // an aborted barrier may have left arrivals counted
}

CommStats LocalCommunicator::stats(int device) const {
  if (device < 0 || device >= devices_)
    fail<ValueError>("communicator stats: device {} is outside 0..{}", device, devices_ - 1);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_[static_cast<size_t>(device)];
}

void LocalCommunicator::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  std::fill(stats_.begin(), stats_.end(), CommStats{});
}

}  // namespace tessera::spmd
