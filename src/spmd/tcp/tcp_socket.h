// Internal: the TCP plumbing under the TCP communicator (communicator_tcp.h): host:port
// endpoints, listening and connecting with retries until a deadline, and whole-buffer
// reads and writes on non-blocking sockets. Every failure is a tessera::Error (IOError
// for the network, ValueError for a malformed endpoint) naming what was being done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::spmd::tcp {

// Seconds on a monotonic clock.
double monotonic_seconds();

// "host:port", "[v6::addr]:port". `what` names the setting in errors
// ("TESSERA_COORDINATOR").
struct Endpoint {
  std::string host;
  int port = 0;
  std::string text() const;
};
Endpoint parse_endpoint(const std::string& text, const std::string& what);

// A file descriptor closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();

 private:
  int fd_ = -1;
};

// A listening socket on every address (IPv6 dual-stack where the kernel has IPv6, else
// IPv4), `port` 0 for an ephemeral one. A busy port is retried until `deadline` (a
// previous attempt's process may still hold it), then an IOError.
Socket listen_on(int port, double deadline, const std::string& what);
int local_port(const Socket& socket);

// Connects to host:port, retrying name resolution and refused or unreachable
// connections (the peer may not listen yet, its DNS name may not exist yet) until
// `deadline`; then an IOError with the last reason. `what` names the peer.
Socket connect_with_retry(const Endpoint& endpoint, double deadline, const std::string& what);

// Accepts one connection until `deadline` (an IOError after it). The new socket is
// non-blocking with TCP_NODELAY; `peer_host` gets its numeric address (an IPv4-mapped
// IPv6 address as plain IPv4).
Socket accept_until(const Socket& listener, double deadline, std::string* peer_host, const std::string& what);

// Non-blocking mode and TCP_NODELAY (messages are whole collectives: no Nagle delay).
void configure_stream(int fd);

// Writes or reads exactly `bytes`, waiting with poll() until `deadline`; an IOError when
// the peer closes the connection or the deadline passes. For the rendezvous only: the
// collectives drive many sockets at once (communicator_tcp.cpp).
void write_all(int fd, const void* data, size_t bytes, double deadline, const std::string& what);
void read_all(int fd, void* data, size_t bytes, double deadline, const std::string& what);

// Little-endian fixed-width integers in byte buffers (the wire format).
void put_u32(std::string& out, uint32_t value);
void put_u64(std::string& out, uint64_t value);
uint32_t get_u32(const unsigned char* in);
uint64_t get_u64(const unsigned char* in);

}  // namespace tessera::spmd::tcp
