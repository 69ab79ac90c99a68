// The TCP communicator (see communicator_tcp.h for the algorithms and failure rules).
#include "spmd/tcp/communicator_tcp.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "spmd/communicator_local.h"
#include "spmd/tcp/tcp_rendezvous.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"

namespace tessera::spmd {
namespace {

using tcp::get_u32;
using tcp::get_u64;
using tcp::monotonic_seconds;

constexpr uint32_t kFrameMagic = 0x4c4f4354;  // "TCOL"
constexpr size_t kHeaderBytes = 24;           // magic, op, sequence number, payload bytes
constexpr uint64_t kMaxAbortText = 1 << 16;

// The message kinds. An all-reduce's two phases have their own so a rank that reduces
// cannot be paired with one that gathers.
enum Op : uint32_t {
  kAllGather = 1,
  kAllToAll = 2,
  kReduceScatter = 3,
  kAllReduceScatter = 4,
  kAllReduceGather = 5,
  kBroadcast = 6,
  kBarrier = 7,
  kPointToPoint = 8,  // the low byte; the tag sits above it (op = 8 | tag << 8)
  kAllToAllV = 9,
  kAbort = 99,
};

bool is_point_to_point(uint32_t op) { return (op & 0xff) == kPointToPoint; }

const char* op_name(uint32_t op) {
  switch (is_point_to_point(op) ? kPointToPoint : op) {
    case kAllGather:
      return "all_gather";
    case kAllToAll:
      return "all_to_all";
    case kReduceScatter:
      return "reduce_scatter";
    case kAllReduceScatter:
      return "all_reduce (its reduce-scatter)";
    case kAllReduceGather:
      return "all_reduce (its all-gather)";
    case kBroadcast:
      return "broadcast";
    case kBarrier:
      return "barrier";
    case kAllToAllV:
      return "all_to_all_v";
    case kPointToPoint:
      return "a point-to-point message";
    case kAbort:
      return "abort";
    default:
      return "an unknown message";
  }
}

void encode_header(unsigned char* out, uint32_t op, uint64_t seq, uint64_t bytes) {
  std::string text;
  tcp::put_u32(text, kFrameMagic);
  tcp::put_u32(text, op);
  tcp::put_u64(text, seq);
  tcp::put_u64(text, bytes);
  std::memcpy(out, text.data(), kHeaderBytes);
}

// One message to one peer, header then payload.
struct Outgoing {
  int peer = 0;
  const char* data = nullptr;
  size_t bytes = 0;
  unsigned char header[kHeaderBytes] = {};
  size_t sent = 0;  // of kHeaderBytes + bytes
  bool done() const { return sent == kHeaderBytes + bytes; }
};

// One message expected from one peer.
struct Incoming {
  int peer = 0;
  char* data = nullptr;
  size_t bytes = 0;
  uint64_t seq = 0;
  unsigned char header[kHeaderBytes] = {};
  size_t received = 0;  // of kHeaderBytes + bytes
  bool done() const { return received == kHeaderBytes + bytes; }
};

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(const TcpOptions& o)
      : rank_(o.rank), world_(o.world), timeout_s_(o.timeout_s), coordinator_(o.coordinator.text()) {
    peers_ = tcp::rendezvous({o.coordinator, o.rank, o.world, o.rendezvous_timeout_s});
    send_seq_.assign(static_cast<size_t>(world_), 0);
    recv_seq_.assign(static_cast<size_t>(world_), 0);
    control_open_.assign(static_cast<size_t>(world_), true);
    if (::pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0)
      fail<IOError>("TCP communicator: pipe failed: {}", std::strerror(errno));
  }
  ~TcpCommunicator() override {
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  std::string kind() const override { return "tcp"; }
  int world_size() const override { return world_; }
  std::vector<int> local_devices() const override { return {rank_}; }

  void all_gather(int device, const std::vector<int>& group, const void* send, void* recv, size_t bytes) override {
    const double start = begin(device, group, "all_gather");
    gather(group, send, recv, bytes, kAllGather, "all_gather");
    finish(start, CommKind::AllGather, group.size(), static_cast<double>(group.size() * bytes));
  }

  void all_to_all(int device, const std::vector<int>& group, const void* send, void* recv, size_t bytes) override {
    const double start = begin(device, group, "all_to_all");
    const size_t n = group.size();
    std::vector<char> staged;
    const char* source = static_cast<const char*>(send);
    if (overlaps(send, n * bytes, recv, n * bytes)) {
      staged.assign(source, source + n * bytes);
      source = staged.data();
    }
    exchange_blocks(group, source, static_cast<char*>(recv), bytes, kAllToAll, "all_to_all");
    finish(start, CommKind::AllToAll, n, static_cast<double>(n * bytes));
  }

  void all_to_all_v(int device, const std::vector<int>& group, const void* send, const std::vector<size_t>& send_bytes,
                    void* recv, const std::vector<size_t>& recv_bytes) override {
    const double start = begin(device, group, "all_to_all_v");
    const size_t n = group.size(), index = index_of(group);
    const RaggedBlocks b = ragged_blocks("all_to_all_v", group, index, send_bytes, recv_bytes);
    std::vector<char> staged;
    const char* source = static_cast<const char*>(send);
    if (overlaps(send, b.send_total, recv, b.recv_total)) {
      staged.assign(source, source + b.send_total);
      source = staged.data();
    }
    char* out = static_cast<char*>(recv);
    if (send_bytes[index] != recv_bytes[index])
      fail<ValueError>("all_to_all_v on devices {}: device {} sends itself {} bytes but expects {}", group, rank_,
                       send_bytes[index], recv_bytes[index]);
    if (send_bytes[index] > 0)
      std::memmove(out + b.recv_offsets[index], source + b.send_offsets[index], send_bytes[index]);
    // Each message's header carries its size: a peer sending other than recv_bytes is an error there.
    std::vector<Outgoing> outs;
    std::vector<Incoming> ins;
    for (size_t j = 0; j < n; ++j) {
      if (j == index) continue;
      outs.push_back(outgoing(group[j], source + b.send_offsets[j], send_bytes[j]));
      ins.push_back(incoming(group[j], out + b.recv_offsets[j], recv_bytes[j]));
    }
    exchange(group, kAllToAllV, "all_to_all_v", outs, ins);
    finish(start, CommKind::RaggedAllToAll, n, b.sent_to_others);
  }

  void reduce_scatter(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                      DType dtype) override {
    const double start = begin(device, group, "reduce_scatter");
    scatter_sum(group, send, recv, count, dtype, kReduceScatter, "reduce_scatter");
    finish(start, CommKind::ReduceScatter, group.size(), static_cast<double>(group.size() * count * itemsize(dtype)));
  }

  void all_reduce(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                  DType dtype) override {
    const double start = begin(device, group, "all_reduce");
    const size_t n = group.size(), item = itemsize(dtype);
    if (n == 1) {
      if (send != recv && count > 0) std::memmove(recv, send, count * item);
    } else {
      // n equal chunks (zero padding past the end never reaches the output).
      const size_t chunk = (count + n - 1) / n;
      const bool padded = chunk * n != count;
      std::vector<char> in;
      const std::unique_ptr<char[]> mine(new char[chunk * item]), out(padded ? new char[n * chunk * item] : nullptr);
      const void* source = send;
      if (padded) {
        in.assign(n * chunk * item, 0);
        if (count > 0) std::memcpy(in.data(), send, count * item);
        source = in.data();
      }
      // The reduce-scatter has read all of send before the gather writes recv (in place is fine).
      scatter_sum(group, source, mine.get(), chunk, dtype, kAllReduceScatter, "all_reduce");
      gather(group, mine.get(), padded ? out.get() : recv, chunk * item, kAllReduceGather, "all_reduce");
      if (padded && count > 0) std::memcpy(recv, out.get(), count * item);
    }
    finish(start, CommKind::AllReduce, n, static_cast<double>(count * item));
  }

  void broadcast(int device, const std::vector<int>& group, void* buffer, size_t bytes) override {
    const double start = begin(device, group, "broadcast");
    if (group.size() > 1) {
      std::vector<Outgoing> out;
      std::vector<Incoming> in;
      if (group.front() == rank_) {
        for (size_t j = 1; j < group.size(); ++j) out.push_back(outgoing(group[j], buffer, bytes));
      } else {
        in.push_back(incoming(group.front(), buffer, bytes));
      }
      exchange(group, kBroadcast, "broadcast", out, in);
    }
    finish(start, CommKind::Other, group.size(), 0);
  }

  void barrier(int device, const std::vector<int>& group) override {
    const double start = begin(device, group, "barrier");
    std::vector<Outgoing> out;
    std::vector<Incoming> in;
    for (int member : group)
      if (member != rank_) {
        out.push_back(outgoing(member, nullptr, 0));
        in.push_back(incoming(member, nullptr, 0));
      }
    exchange(group, kBarrier, "barrier", out, in);
    finish(start, CommKind::Other, group.size(), 0);
  }

  // Point-to-point messages share the pair's data connection and sequence numbers with
  // the collectives. A send is queued and written as the socket takes it, during this
  // and every later call (so two ranks that send before they receive both progress); a
  // recv reads the peer's messages in order, keeping those of other tags for their own
  // recv. A collective first finishes the queued sends, and keeps a point-to-point
  // message that arrives before its own for a later recv.
  void send(int device, int to, int tag, const void* data, size_t bytes) override {
    const std::vector<int> pair{rank_, to};
    const double start = begin(device, pair, "send");
    check_tag(tag, "send");
    pending_.push_back(outgoing(to, data, bytes));
    encode_header(pending_.back().header, kPointToPoint | static_cast<uint32_t>(tag) << 8, send_seq_[to]++, bytes);
    progress(nullptr, "send", pair);
    finish(start, CommKind::Other, 2, 0);
  }

  void recv(int device, int from, int tag, void* data, size_t bytes) override {
    const std::vector<int> pair{from, rank_};
    const double start = begin(device, pair, "recv");
    check_tag(tag, "recv");
    auto& kept = stash_[{from, tag}];
    if (!kept.empty()) {
      if (kept.front().size() != bytes)
        fail<Error>("recv on rank {} from rank {} (tag {}): {} bytes arrived where {} were expected", rank_, from, tag,
                    kept.front().size(), bytes);
      if (bytes > 0) std::memcpy(data, kept.front().data(), bytes);
      kept.pop_front();
    } else {
      Wanted want;
      want.from = from;
      want.tag = tag;
      want.data = static_cast<char*>(data);
      want.bytes = bytes;
      progress(&want, "recv", pair);
    }
    finish(start, CommKind::Other, 2, 0);
  }

  void wait_sends(int device) override {
    const double start = begin(device, {rank_}, "wait_sends");
    progress(nullptr, "wait_sends", {rank_}, /*until_sent=*/true);
    finish(start, CommKind::Other, 1, 0);
  }

  void abort(const std::string& reason) override { abort_with(fmt::format("rank {}: {}", rank_, reason)); }

  // Messages may be half sent when a collective throws: the connections cannot be
  // trusted again, so an aborted communicator stays aborted (as under MPI).
  void reset() override {}

  CommStats stats(int device) const override {
    if (device != rank_)
      fail<ValueError>("communicator stats: device {} belongs to rank {}; this is rank {}", device, device, rank_);
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_ = {};
  }

 private:
  double begin(int device, const std::vector<int>& group, const char* op) {
    const double start = monotonic_seconds();
    if (device != rank_) fail<ValueError>("{}: device {} is not driven by this process (rank {})", op, device, rank_);
    check_group_members(op, rank_, group, world_,
                        fmt::format("the TCP job has {} ranks (coordinator {})", world_, coordinator_));
    read_control_notes(0);
    if (aborted_) throw_aborted(op, group);
    return start;
  }

  void finish(double start, CommKind kind, size_t n, double full_bytes) {
    const double seconds = monotonic_seconds() - start;
    std::lock_guard<std::mutex> lock(mutex_);
    record_call(stats_, kind, static_cast<int>(n), full_bytes, seconds);
  }

  size_t index_of(const std::vector<int>& group) const {
    return static_cast<size_t>(std::find(group.begin(), group.end(), rank_) - group.begin());
  }

  static Outgoing outgoing(int peer, const void* data, size_t bytes) {
    Outgoing o;
    o.peer = peer;
    o.data = static_cast<const char*>(data);
    o.bytes = bytes;
    return o;
  }
  static Incoming incoming(int peer, void* data, size_t bytes) {
    Incoming i;
    i.peer = peer;
    i.data = static_cast<char*>(data);
    i.bytes = bytes;
    return i;
  }

  // recv = concat over members of their `bytes`-sized blocks (send is this member's).
  void gather(const std::vector<int>& group, const void* send, void* recv, size_t bytes, uint32_t op,
              const char* name) {
    const size_t n = group.size(), index = index_of(group);
    char* out = static_cast<char*>(recv);
    std::vector<char> staged;
    const char* mine = static_cast<const char*>(send);
    if (mine != out + index * bytes && overlaps(send, bytes, recv, n * bytes)) {
      staged.assign(mine, mine + bytes);
      mine = staged.data();
    }
    if (mine != out + index * bytes && bytes > 0) std::memmove(out + index * bytes, mine, bytes);
    std::vector<Outgoing> outs;
    std::vector<Incoming> ins;
    for (size_t j = 0; j < n; ++j) {
      if (j == index) continue;
      outs.push_back(outgoing(group[j], out + index * bytes, bytes));
      ins.push_back(incoming(group[j], out + j * bytes, bytes));
    }
    exchange(group, op, name, outs, ins);
  }

  // recv block j = member j's block `index` of its send (n blocks of `bytes`).
  void exchange_blocks(const std::vector<int>& group, const char* send, char* recv, size_t bytes, uint32_t op,
                       const char* name) {
    const size_t n = group.size(), index = index_of(group);
    if (bytes > 0) std::memmove(recv + index * bytes, send + index * bytes, bytes);
    std::vector<Outgoing> outs;
    std::vector<Incoming> ins;
    for (size_t j = 0; j < n; ++j) {
      if (j == index) continue;
      outs.push_back(outgoing(group[j], send + j * bytes, bytes));
      ins.push_back(incoming(group[j], recv + j * bytes, bytes));
    }
    exchange(group, op, name, outs, ins);
  }

  // recv (count elements) = ordered sum over members of their block `index` of send.
  void scatter_sum(const std::vector<int>& group, const void* send, void* recv, size_t count, DType dtype, uint32_t op,
                   const char* name) {
    const size_t n = group.size(), block = count * itemsize(dtype);
    if (n == 1) {
      if (send != recv && block > 0) std::memmove(recv, send, block);
      return;
    }
    const std::unique_ptr<char[]> blocks(new char[n * block]);  // every byte is written before it is read
    exchange_blocks(group, static_cast<const char*>(send), blocks.get(), block, op, name);
    std::vector<const char*> srcs(n);
    for (size_t j = 0; j < n; ++j) srcs[j] = blocks.get() + j * block;
    ordered_sum(recv, srcs, count, dtype);
  }

  // Drives every message of one collective to completion with one poll() loop, also
  // watching the control connections (abort notes) and the wake pipe (a local abort).
  void exchange(const std::vector<int>& group, uint32_t op, const char* name, std::vector<Outgoing>& outs,
                std::vector<Incoming>& ins) {
    if (!pending_.empty()) progress(nullptr, name, group, /*until_sent=*/true);  // the pair streams stay in order
    for (Outgoing& o : outs) encode_header(o.header, op, send_seq_[o.peer]++, o.bytes);
    for (Incoming& i : ins) i.seq = recv_seq_[i.peer]++;
    const double deadline = timeout_s_ > 0 ? monotonic_seconds() + timeout_s_ : std::numeric_limits<double>::infinity();
    std::vector<pollfd> fds;
    std::vector<int> peer_of;  // fds index -> peer (-1: wake pipe; -2 - r: control of rank r)
    // Send what the sockets take at once, before the first poll. (Polling without
    // sleeping for 50 or 200 us before blocking was tried and dropped: on 2 cores the
    // spinning rank starves its peer; bench/spmd/compare_collectives.sh.)
    for (Outgoing& o : outs) push(o, op, name, group);
    while (true) {
      if (aborted_) throw_aborted(name, group);
      fds.clear();
      peer_of.clear();
      auto slot = [&](int peer) -> pollfd& {
        for (size_t k = 0; k < peer_of.size(); ++k)
          if (peer_of[k] == peer) return fds[k];
        fds.push_back({peers_.data[peer].fd(), 0, 0});
        peer_of.push_back(peer);
        return fds.back();
      };
      for (const Outgoing& o : outs)
        if (!o.done()) slot(o.peer).events |= POLLOUT;
      for (const Incoming& i : ins)
        if (!i.done()) slot(i.peer).events |= POLLIN;
      if (fds.empty()) return;
      const auto waiting = [&] {
        std::vector<int> peers;
        for (const Incoming& i : ins)
          if (!i.done()) peers.push_back(i.peer);
        return fmt::format(" waiting for rank(s) {}", fmt::join(peers, ", "));
      };
      if (!poll_round(fds, peer_of, deadline, name, group, waiting)) continue;
      if (aborted_) throw_aborted(name, group);
      for (Outgoing& o : outs)
        if (!o.done()) push(o, op, name, group);
      for (Incoming& i : ins)
        if (!i.done()) pull(i, op, name, group);
    }
  }

  // Sends what the socket takes now (header, then payload).
  void push(Outgoing& o, uint32_t op, const char* name, const std::vector<int>& group) {
    const int fd = peers_.data[o.peer].fd();
    while (!o.done()) {
      const bool in_header = o.sent < kHeaderBytes;
      const char* from =
          in_header ? reinterpret_cast<const char*>(o.header) + o.sent : o.data + (o.sent - kHeaderBytes);
      const size_t left = in_header ? kHeaderBytes - o.sent : o.bytes - (o.sent - kHeaderBytes);
      const ssize_t n = ::send(fd, from, left, MSG_NOSIGNAL);
      if (n > 0) {
        o.sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      peer_lost(o.peer, op, name, group, n < 0 ? std::strerror(errno) : "closed");
    }
  }

  // Receives what has arrived (header, checked, then payload).
  void pull(Incoming& i, uint32_t op, const char* name, const std::vector<int>& group) {
    const int fd = peers_.data[i.peer].fd();
    while (!i.done()) {
      const bool in_header = i.received < kHeaderBytes;
      char* to = in_header ? reinterpret_cast<char*>(i.header) + i.received : i.data + (i.received - kHeaderBytes);
      const size_t left = in_header ? kHeaderBytes - i.received : i.bytes - (i.received - kHeaderBytes);
      const ssize_t n = ::recv(fd, to, left, 0);
      if (n > 0) {
        i.received += static_cast<size_t>(n);
        if (i.received == kHeaderBytes && get_u32(i.header) == kFrameMagic &&
            is_point_to_point(get_u32(i.header + 4)) && get_u64(i.header + 8) == i.seq) {
          // A point-to-point message sent before the collective's: kept for its recv.
          stash_message(i.peer, i.header, name, group);
          ++i.seq;
          ++recv_seq_[i.peer];
          i.received = 0;
          continue;
        }
        if (i.received == kHeaderBytes) check_header(i, op, name, group);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      peer_lost(i.peer, op, name, group, n < 0 ? std::strerror(errno) : "closed");
    }
  }

  static void check_tag(int tag, const char* op) {
    if (tag < 0 || tag > Communicator::kMaxTag)
      fail<ValueError>("{}: tag {} is outside 0 .. {}", op, tag, Communicator::kMaxTag);
  }

  // The message a recv waits for, and its progress.
  struct Wanted {
    int from = 0, tag = 0;
    char* data = nullptr;
    size_t bytes = 0;
    unsigned char header[kHeaderBytes] = {};
    size_t got = 0;  // of the header, then of the payload
    bool in_payload = false;
    std::vector<char> other;  // a message of another tag being read
    char* target = nullptr;   // data, or other.data()
    bool mine = false;        // the payload being read is the wanted one
    size_t target_bytes = 0;
    bool done = false;
  };

  // Reads the payload of a point-to-point message whose header was just read from
  // `peer` into the stash (its sender wrote it right behind the header).
  void stash_message(int peer, const unsigned char* header, const char* name, const std::vector<int>& group) {
    const uint32_t tag = get_u32(header + 4) >> 8;
    const uint64_t bytes = get_u64(header + 16);
    std::vector<char> payload(static_cast<size_t>(bytes));
    const double deadline = timeout_s_ > 0 ? monotonic_seconds() + timeout_s_ : std::numeric_limits<double>::infinity();
    try {
      if (bytes > 0) tcp::read_all(peers_.data[peer].fd(), payload.data(), payload.size(), deadline, name);
    } catch (const IOError& e) {
      peer_lost(peer, kPointToPoint, name, group, e.what());
    }
    stash_[{peer, static_cast<int>(tag)}].push_back(std::move(payload));
  }

  // Writes the queued sends (each peer's in order) and, for a recv, reads `want`'s peer
  // until its message is here; with until_sent, until every queued send is written.
  // Without either it writes what the sockets take now and returns.
  void progress(Wanted* want, const char* name, const std::vector<int>& group, bool until_sent = false) {
    const double deadline = timeout_s_ > 0 ? monotonic_seconds() + timeout_s_ : std::numeric_limits<double>::infinity();
    std::vector<pollfd> fds;
    std::vector<int> peer_of;
    while (true) {
      if (aborted_) throw_aborted(name, group);
      // The first unfinished send of each peer may be written; later ones wait their turn.
      std::vector<Outgoing*> heads;
      for (Outgoing& o : pending_) {
        if (o.done()) continue;
        bool first = true;
        for (Outgoing* h : heads) first = first && h->peer != o.peer;
        if (first) heads.push_back(&o);
      }
      for (Outgoing* o : heads) push(*o, kPointToPoint, name, group);
      while (!pending_.empty() && pending_.front().done()) pending_.pop_front();
      if (want != nullptr) pull_wanted(*want, name, group);
      const bool sent = pending_.empty();
      if (want != nullptr ? want->done && (!until_sent || sent) : (!until_sent || sent)) return;
      fds.clear();
      peer_of.clear();
      for (const Outgoing& o : pending_)
        if (!o.done()) {
          bool listed = false;
          for (int p : peer_of) listed = listed || p == o.peer;
          if (!listed) {
            fds.push_back({peers_.data[o.peer].fd(), POLLOUT, 0});
            peer_of.push_back(o.peer);
          }
        }
      if (want != nullptr && !want->done) {
        bool listed = false;
        for (size_t k = 0; k < peer_of.size(); ++k)
          if (peer_of[k] == want->from) {
            fds[k].events |= POLLIN;
            listed = true;
          }
        if (!listed) {
          fds.push_back({peers_.data[want->from].fd(), POLLIN, 0});
          peer_of.push_back(want->from);
        }
      }
      poll_round(fds, peer_of, deadline, name, group, [] { return std::string(); });
    }
  }

  // One wait of a collective or point-to-point loop: `fds` (sockets, their peers in
  // `peer_of`) plus the wake pipe and the open control connections, up to a second or
  // the deadline (past it the job aborts, naming `waiting()`). Reads abort notes and drains
  // the wake pipe. Returns whether any of `fds` is ready.
  bool poll_round(std::vector<pollfd>& fds, std::vector<int>& peer_of, double deadline, const char* name,
                  const std::vector<int>& group, const std::function<std::string()>& waiting) {
    fds.push_back({wake_[0], POLLIN, 0});
    peer_of.push_back(-1);
    for (int r = 0; r < world_; ++r)
      if (r != rank_ && control_open_[r]) {
        fds.push_back({peers_.control[r].fd(), POLLIN, 0});
        peer_of.push_back(-2 - r);
      }
    const double left = deadline - monotonic_seconds();
    if (left <= 0) {
      abort_with(fmt::format("rank {}: {} on devices {} timed out after {:g} s{} (TESSERA_TCP_TIMEOUT_S)", rank_, name,
                             group, timeout_s_, waiting()));
      throw_aborted(name, group);
    }
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min(std::ceil(left * 1000), 1000.0)));
    if (ready < 0 && errno != EINTR) fail<IOError>("{}: poll failed: {}", name, std::strerror(errno));
    if (ready <= 0) return false;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      if (peer_of[k] == -1) {
        char drain[64];
        while (::read(wake_[0], drain, sizeof drain) > 0) {
        }
      } else if (peer_of[k] <= -2) {
        read_control_note(-2 - peer_of[k]);
      }
    }
    return true;
  }

  // Reads what has arrived from want.from: headers (checked: a point-to-point message,
  // the next in sequence), then payloads into the recv's buffer or the stash.
  void pull_wanted(Wanted& w, const char* name, const std::vector<int>& group) {
    const int fd = peers_.data[w.from].fd();
    while (!w.done) {
      char* to = w.in_payload ? w.target + w.got : reinterpret_cast<char*>(w.header) + w.got;
      const size_t left = w.in_payload ? w.target_bytes - w.got : kHeaderBytes - w.got;
      if (left > 0) {
        const ssize_t n = ::recv(fd, to, left, 0);
        if (n <= 0) {
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
          peer_lost(w.from, kPointToPoint, name, group, n < 0 ? std::strerror(errno) : "closed");
        }
        w.got += static_cast<size_t>(n);
        if (w.got < (w.in_payload ? w.target_bytes : kHeaderBytes)) continue;
      }
      if (!w.in_payload) {
        const uint32_t magic = get_u32(w.header), op = get_u32(w.header + 4);
        const uint64_t seq = get_u64(w.header + 8), bytes = get_u64(w.header + 16);
        if (magic != kFrameMagic || !is_point_to_point(op) || seq != recv_seq_[w.from]) {
          abort_with(fmt::format(
              "rank {}: recv from rank {} (tag {}): rank {} sent {} (message {}) where this rank expected a "
              "point-to-point message (message {}): the ranks are not running the same program",
              rank_, w.from, w.tag, w.from, magic == kFrameMagic ? op_name(op) : "bytes that are not a tessera message",
              seq, recv_seq_[w.from]));
          throw_aborted(name, group);
        }
        ++recv_seq_[w.from];
        const int tag = static_cast<int>(op >> 8);
        if (tag == w.tag) {
          if (bytes != w.bytes) {
            abort_with(fmt::format("rank {}: recv from rank {} (tag {}): {} bytes arrived where {} were expected",
                                   rank_, w.from, w.tag, bytes, w.bytes));
            throw_aborted(name, group);
          }
          w.target = w.data;
          w.mine = true;
        } else {
          w.other.assign(static_cast<size_t>(bytes), 0);
          w.target = w.other.data();
        }
        w.target_bytes = static_cast<size_t>(bytes);
        w.in_payload = true;
        w.got = 0;
        continue;
      }
      // A payload is complete.
      if (w.mine) {
        w.done = true;
      } else {
        stash_[{w.from, static_cast<int>(get_u32(w.header + 4) >> 8)}].push_back(std::move(w.other));
        w.other.clear();
        w.in_payload = false;
        w.got = 0;
      }
    }
  }

  void check_header(const Incoming& i, uint32_t op, const char* name, const std::vector<int>& group) {
    const uint32_t magic = get_u32(i.header), their_op = get_u32(i.header + 4);
    const uint64_t seq = get_u64(i.header + 8), bytes = get_u64(i.header + 16);
    if (magic == kFrameMagic && their_op == op && seq == i.seq && bytes == i.bytes) return;
    const std::string reason =
        magic != kFrameMagic
            ? fmt::format("rank {}: {} on devices {}: rank {} sent bytes that are not a tessera message", rank_, name,
                          group, i.peer)
            : fmt::format(
                  "rank {}: {} on devices {}: rank {} sent {} of {} bytes (message {}) where this rank expected {} "
                  "of {} bytes (message {}): the ranks are not running the same program",
                  rank_, name, group, i.peer, op_name(their_op), bytes, seq, op_name(op), i.bytes, i.seq);
    abort_with(reason);
    throw_aborted(name, group);
  }

  [[noreturn]] void peer_lost(int peer, uint32_t op, const char* name, const std::vector<int>& group,
                              const std::string& how) {
    read_control_notes(0.2);  // the peer may have said why before it went
    if (!aborted_)
      abort_with(
          fmt::format("rank {}: rank {} closed its connection during {} on devices {} ({}: it failed or "
                      "exited)",
                      rank_, peer, op_name(op), group, how));
    throw_aborted(name, group);
  }

  // Reads the abort notes that have arrived (waiting up to `wait_s` for one).
  void read_control_notes(double wait_s) {
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    for (int r = 0; r < world_; ++r)
      if (r != rank_ && control_open_[r]) {
        fds.push_back({peers_.control[r].fd(), POLLIN, 0});
        ranks.push_back(r);
      }
    if (fds.empty()) return;
    if (::poll(fds.data(), fds.size(), static_cast<int>(wait_s * 1000)) <= 0) return;
    for (size_t k = 0; k < fds.size(); ++k)
      if (fds[k].revents != 0) read_control_note(ranks[k]);
  }

  // One abort note from rank r, or the end of its control connection (it exited:
  // not a failure by itself; a collective that needs it will say so).
  void read_control_note(int r) {
    const int fd = peers_.control[r].fd();
    unsigned char header[kHeaderBytes];
    const ssize_t n = ::recv(fd, header, sizeof header, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      control_open_[r] = false;
      return;
    }
    std::string text;
    try {
      const double deadline = monotonic_seconds() + 2;
      tcp::read_all(fd, header, sizeof header, deadline, "abort note");
      const uint64_t bytes = get_u64(header + 16);
      if (get_u32(header) != kFrameMagic || get_u32(header + 4) != kAbort || bytes > kMaxAbortText)
        text = fmt::format("rank {} sent a malformed abort note", r);
      else {
        text.resize(bytes);
        tcp::read_all(fd, text.data(), text.size(), deadline, "abort note");
      }
    } catch (const IOError&) {
      text = fmt::format("rank {} closed its control connection in the middle of an abort note", r);
    }
    control_open_[r] = false;  // nothing follows an abort note
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) {
      reason_ = text;
      aborted_ = true;
    }
  }

  // Marks the communicator aborted with `reason` and tells every other rank (best
  // effort, never blocking: a note is small and the sockets are otherwise idle).
  void abort_with(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (aborted_) return;
      reason_ = reason;
      aborted_ = true;
    }
    std::string frame(kHeaderBytes, '\0');
    encode_header(reinterpret_cast<unsigned char*>(frame.data()), kAbort, 0, reason.size());
    frame += reason;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_ || !peers_.control[r].valid()) continue;
      [[maybe_unused]] const ssize_t n =
          ::send(peers_.control[r].fd(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    [[maybe_unused]] const ssize_t n = ::write(wake_[1], "x", 1);
  }

  [[noreturn]] void throw_aborted(const char* op, const std::vector<int>& group) const {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reason = reason_;
    }
    fail<Error>("{} on devices {}: aborted: {}", op, group, reason);
  }

  const int rank_, world_;
  const double timeout_s_;
  const std::string coordinator_;
  tcp::PeerSockets peers_;
  std::vector<uint64_t> send_seq_, recv_seq_;                           // per peer, on its data connection
  std::deque<Outgoing> pending_;                                        // queued point-to-point sends, in order
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> stash_;  // (peer, tag): arrived, not yet received
  std::vector<bool> control_open_;                                      // the collective thread's view
  int wake_[2] = {-1, -1};
  mutable std::mutex mutex_;  // stats_, reason_
  std::atomic<bool> aborted_{false};
  std::string reason_;
  CommStats stats_;
};

double seconds_from_env(const char* name, double fallback) {
  const char* text = flags::env(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0) || !std::isfinite(value))
    fail<ValueError>("{}='{}': expected seconds (a number >= 0)", name, text);
  return value;
}

int int_from_env(const char* name, const char* purpose) {
  const char* text = flags::env(name);
  if (text == nullptr || *text == '\0')
    fail<ValueError>("TESSERA_COORDINATOR is set (a TCP job) but {} is not: {} (tessera launch sets both)", name,
                     purpose);
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0 || value > 1 << 20)
    fail<ValueError>("{}='{}': expected {}", name, text, purpose);
  return static_cast<int>(value);
}

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(const TcpOptions& options) {
  if (!(options.timeout_s >= 0)) fail<ValueError>("TCP communicator: timeout {} s; expected >= 0", options.timeout_s);
  return std::make_unique<TcpCommunicator>(options);
}

bool tcp_requested() {
  const char* coordinator = flags::env("TESSERA_COORDINATOR");
  return coordinator != nullptr && *coordinator != '\0';
}

Communicator& tcp_communicator() {
  static std::once_flag once;
  static Communicator* instance = nullptr;
  std::call_once(once, [] {
    TcpOptions o;
    o.coordinator = tcp::parse_endpoint(flags::env("TESSERA_COORDINATOR"), "TESSERA_COORDINATOR");
    o.world = int_from_env("TESSERA_WORLD_SIZE", "the number of ranks in the job (at least 1)");
    o.rank = int_from_env("TESSERA_RANK", "this process's rank (0 .. TESSERA_WORLD_SIZE-1)");
    o.rendezvous_timeout_s = seconds_from_env("TESSERA_RENDEZVOUS_TIMEOUT_S", 300);
    o.timeout_s = seconds_from_env("TESSERA_TCP_TIMEOUT_S", 1800);
    instance = make_tcp_communicator(o).release();  // never deleted: device threads may outlive statics
  });
  return *instance;
}

}  // namespace tessera::spmd
