// The TCP rendezvous (see tcp_rendezvous.h for the protocol).
#include "spmd/tcp/tcp_rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/base/error.h"

namespace tessera::spmd::tcp {
namespace {

constexpr uint32_t kHelloMagic = 0x4f4c4854;    // "THLO"
constexpr uint32_t kTableMagic = 0x4c425454;    // "TTBL"
constexpr uint32_t kRejectMagic = 0x4a455254;   // "TREJ"
constexpr uint32_t kWelcomeMagic = 0x4c455754;  // "TWEL"
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloBytes = 24;
constexpr uint32_t kMaxText = 1 << 16;

struct Hello {
  uint32_t world = 0, rank = 0, channel = 0, port = 0;
};

std::string encode_hello(const Hello& h) {
  std::string out;
  for (uint32_t v : {kHelloMagic, kVersion, h.world, h.rank, h.channel, h.port}) put_u32(out, v);
  return out;
}

// Reads a hello; false when the connection is not one of ours (a stray connection, a
// health check): it is dropped without failing the rendezvous.
bool read_hello(const Socket& s, double deadline, Hello* h) {
  unsigned char buffer[kHelloBytes];
  try {
    read_all(s.fd(), buffer, sizeof buffer, deadline, "rendezvous hello");
  } catch (const IOError&) {
    return false;
  }
  if (get_u32(buffer) != kHelloMagic || get_u32(buffer + 4) != kVersion) return false;
  h->world = get_u32(buffer + 8);
  h->rank = get_u32(buffer + 12);
  h->channel = get_u32(buffer + 16);
  h->port = get_u32(buffer + 20);
  return true;
}

// Tells the peer why it cannot join (best effort), then fails here with the same words.
[[noreturn]] void reject(const Socket& s, const std::string& reason) {
  std::string out;
  put_u32(out, kRejectMagic);
  put_u32(out, static_cast<uint32_t>(reason.size()));
  out += reason;
  try {
    write_all(s.fd(), out.data(), out.size(), monotonic_seconds() + 2, "rendezvous reject");
  } catch (const Error&) {
  }
  fail<ValueError>("{}", reason);
}

// The checks both the coordinator and a rank's own listener make of a hello.
std::string hello_problem(const Hello& h, const RendezvousOptions& o, int lowest_rank,
                          const std::vector<std::vector<bool>>& seen) {
  if (static_cast<int>(h.world) != o.world)
    return fmt::format(
        "TCP rendezvous at {}: rank {} says the job has {} ranks, rank {} says {} (every process needs the same "
        "TESSERA_WORLD_SIZE: the same --nnodes and --nproc-per-host on every host)",
        o.coordinator.text(), h.rank, h.world, o.rank, o.world);
  if (static_cast<int>(h.rank) < lowest_rank || static_cast<int>(h.rank) >= o.world || h.channel > 1)
    return fmt::format("TCP rendezvous at {}: a process claims rank {} (channel {}), expected a rank from {} to {}",
                       o.coordinator.text(), h.rank, h.channel, lowest_rank, o.world - 1);
  if (seen[h.rank][h.channel])
    return fmt::format(
        "TCP rendezvous at {}: two processes claim rank {} (is --node-rank the same on two hosts, or is a process "
        "of an earlier attempt still running?)",
        o.coordinator.text(), h.rank);
  return {};
}

// The table rank 0 sends: for every rank, the address rank 0 saw and its listener's port.
struct Entry {
  std::string host;
  uint32_t port = 0;
};

std::string encode_table(const std::vector<Entry>& table) {
  std::string out;
  put_u32(out, kTableMagic);
  put_u32(out, static_cast<uint32_t>(table.size()));
  for (const Entry& e : table) {
    put_u32(out, e.port);
    put_u32(out, static_cast<uint32_t>(e.host.size()));
    out += e.host;
  }
  return out;
}

std::vector<Entry> read_table(const Socket& s, const RendezvousOptions& o, double deadline) {
  const std::string what =
      fmt::format("TCP rendezvous: rank {} waiting for the table from {}", o.rank, o.coordinator.text());
  unsigned char head[8];
  read_all(s.fd(), head, sizeof head, deadline, what);
  const uint32_t magic = get_u32(head), count = get_u32(head + 4);
  if (magic != kTableMagic || static_cast<int>(count) != o.world)
    fail<IOError>("{}: an unexpected reply (not a tessera coordinator of a {}-rank job?)", what, o.world);
  std::vector<Entry> table(count);
  for (Entry& e : table) {
    unsigned char field[8];
    read_all(s.fd(), field, sizeof field, deadline, what);
    e.port = get_u32(field);
    const uint32_t length = get_u32(field + 4);
    if (length > 1024) fail<IOError>("{}: a host name of {} bytes in the table", what, length);
    e.host.resize(length);
    read_all(s.fd(), e.host.data(), length, deadline, what);
  }
  return table;
}

// Accepts the data and control connections of ranks lowest..world-1 on `listener`.
void accept_peers(const Socket& listener, const RendezvousOptions& o, int lowest, double deadline, PeerSockets* peers,
                  std::vector<std::string>* hosts, std::vector<uint32_t>* ports) {
  std::vector<std::vector<bool>> seen(static_cast<size_t>(o.world), std::vector<bool>(2, false));
  int expected = 2 * (o.world - lowest);
  const std::string what =
      o.rank == 0
          ? fmt::format("TCP rendezvous: the coordinator (rank 0, port {}) waiting for ranks {}..{}",
                        o.coordinator.port, lowest, o.world - 1)
          : fmt::format("TCP rendezvous: rank {} waiting for ranks {}..{} to connect", o.rank, lowest, o.world - 1);
  while (expected > 0) {
    std::string host;
    Socket s;
    try {
      s = accept_until(listener, deadline, &host, what);
    } catch (const IOError&) {
      std::vector<int> missing;
      for (int r = lowest; r < o.world; ++r)
        if (!seen[r][0] || !seen[r][1]) missing.push_back(r);
      fail<IOError>("{}: timed out after {:g} s; rank(s) {} never connected", what, o.timeout_s,
                    fmt::join(missing, ", "));
    }
    Hello h;
    if (!read_hello(s, std::min(deadline, monotonic_seconds() + 10), &h)) continue;
    if (const std::string problem = hello_problem(h, o, lowest, seen); !problem.empty()) reject(s, problem);
    std::string welcome;
    put_u32(welcome, kWelcomeMagic);
    write_all(s.fd(), welcome.data(), welcome.size(), deadline, what);
    seen[h.rank][h.channel] = true;
    if (h.channel == 0) {
      if (hosts) (*hosts)[h.rank] = host;
      if (ports) (*ports)[h.rank] = h.port;
      peers->data[h.rank] = std::move(s);
    } else {
      peers->control[h.rank] = std::move(s);
    }
    --expected;
  }
}

// Connects, says hello and waits for the welcome (or the reason it is refused).
Socket connect_and_greet(const Endpoint& to, const RendezvousOptions& o, uint32_t channel, uint32_t port,
                         double deadline, const std::string& what) {
  Socket s = connect_with_retry(to, deadline, what);
  const std::string hello =
      encode_hello({static_cast<uint32_t>(o.world), static_cast<uint32_t>(o.rank), channel, port});
  write_all(s.fd(), hello.data(), hello.size(), deadline, what);
  unsigned char reply[4];
  read_all(s.fd(), reply, sizeof reply, deadline, what + " (waiting for its welcome)");
  if (get_u32(reply) == kWelcomeMagic) return s;
  if (get_u32(reply) != kRejectMagic)
    fail<IOError>("{}: {} answered with something that is not tessera's", what, to.text());
  unsigned char size[4];
  read_all(s.fd(), size, sizeof size, deadline, what);
  std::string reason(std::min(get_u32(size), kMaxText), '\0');
  read_all(s.fd(), reason.data(), reason.size(), deadline, what);
  fail<ValueError>("{} (refused by {})", reason, to.text());
}

}  // namespace

PeerSockets rendezvous(const RendezvousOptions& o) {
  if (o.world < 1) fail<ValueError>("TCP rendezvous: a world of {} ranks; expected at least 1", o.world);
  if (o.rank < 0 || o.rank >= o.world)
    fail<ValueError>("TCP rendezvous: rank {} is outside 0..{} (TESSERA_RANK, TESSERA_WORLD_SIZE)", o.rank,
                     o.world - 1);
  PeerSockets peers;
  peers.data.resize(static_cast<size_t>(o.world));
  peers.control.resize(static_cast<size_t>(o.world));
  if (o.world == 1) return peers;
  const double deadline = monotonic_seconds() + o.timeout_s;

  if (o.rank == 0) {
    std::vector<std::string> hosts(static_cast<size_t>(o.world));
    std::vector<uint32_t> ports(static_cast<size_t>(o.world), 0);
    {
      const Socket listener =
          listen_on(o.coordinator.port, deadline,
                    fmt::format("TCP rendezvous: the coordinator (rank 0, {})", o.coordinator.text()));
      accept_peers(listener, o, 1, deadline, &peers, &hosts, &ports);
    }  // closed: a late or stale process cannot join this job
    std::vector<Entry> table(static_cast<size_t>(o.world));
    for (int r = 1; r < o.world; ++r) table[r] = {hosts[r], ports[r]};
    const std::string bytes = encode_table(table);
    for (int r = 1; r < o.world; ++r)
      write_all(peers.data[r].fd(), bytes.data(), bytes.size(), deadline,
                fmt::format("TCP rendezvous: sending the table to rank {}", r));
    return peers;
  }

  // Listen first (dual-stack: peers reach it at whatever address rank 0 saw), so the
  // port in the hello is already accepting.
  const bool listens = o.rank < o.world - 1;
  Socket listener;
  if (listens) listener = listen_on(0, deadline, fmt::format("TCP rendezvous: rank {}'s listener", o.rank));
  const uint32_t port = listens ? static_cast<uint32_t>(local_port(listener)) : 0;
  const std::string to_coordinator = fmt::format("TCP rendezvous: rank {} reaching the coordinator", o.rank);
  peers.data[0] = connect_and_greet(o.coordinator, o, 0, port, deadline, to_coordinator);
  peers.control[0] = connect_and_greet(o.coordinator, o, 1, 0, deadline, to_coordinator);
  const std::vector<Entry> table = read_table(peers.data[0], o, deadline);
  for (int i = 1; i < o.rank; ++i) {
    const std::string what = fmt::format("TCP rendezvous: rank {} connecting to rank {}", o.rank, i);
    const Endpoint to{table[i].host, static_cast<int>(table[i].port)};
    peers.data[i] = connect_and_greet(to, o, 0, 0, deadline, what);
    peers.control[i] = connect_and_greet(to, o, 1, 0, deadline, what);
  }
  if (listens) accept_peers(listener, o, o.rank + 1, deadline, &peers, nullptr, nullptr);
  return peers;
}

}  // namespace tessera::spmd::tcp
