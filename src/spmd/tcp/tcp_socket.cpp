// TCP endpoints, listen/connect with retries and whole-buffer I/O (see tcp_socket.h).
#include "spmd/tcp/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "tessera/base/error.h"

namespace tessera::spmd::tcp {
namespace {

int poll_timeout_ms(double deadline) {
  const double left = deadline - monotonic_seconds();
  if (left <= 0) return 0;
  return static_cast<int>(std::min(std::ceil(left * 1000), 1000.0));
}

std::string numeric_host(const sockaddr_storage& address, socklen_t length) {
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof host, nullptr, 0,
                    NI_NUMERICHOST) != 0)
    return "?";
  std::string text = host;
  // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d; peers reach them as IPv4.
  if (text.starts_with("::ffff:") && text.find('.') != std::string::npos) text = text.substr(7);
  return text;
}

// A non-blocking connect given at most 5 s (and no more than the deadline): a peer
// that is not up yet is tried again rather than waited on for the kernel's SYN retries.
// Returns "" on success, else the reason.
std::string connect_within(int fd, const sockaddr* address, socklen_t length, double deadline) {
  if (::connect(fd, address, length) == 0) return {};
  if (errno != EINPROGRESS) return std::strerror(errno);
  const double until = std::min(deadline, monotonic_seconds() + 5);
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, poll_timeout_ms(until));
    if (ready > 0) {
      int error = 0;
      socklen_t size = sizeof error;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      return error == 0 ? std::string() : std::string(std::strerror(error));
    }
    if (ready < 0 && errno != EINTR) return std::strerror(errno);
    if (monotonic_seconds() >= until) return "timed out";
  }
}

}  // namespace

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Endpoint::text() const {
  return host.find(':') != std::string::npos ? "[" + host + "]:" + std::to_string(port)
                                             : host + ":" + std::to_string(port);
}

Endpoint parse_endpoint(const std::string& text, const std::string& what) {
  Endpoint endpoint;
  std::string port;
  if (text.starts_with("[")) {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      fail<ValueError>("{} '{}': expected HOST:PORT or [IPv6]:PORT", what, text);
    endpoint.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon)
      fail<ValueError>("{} '{}': expected HOST:PORT (an IPv6 address goes in brackets: [::1]:29500)", what, text);
    endpoint.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (endpoint.host.empty()) fail<ValueError>("{} '{}': the host is empty; expected HOST:PORT", what, text);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) < 1 || std::stoi(port) > 65535)
    fail<ValueError>("{} '{}': the port '{}' is not a number from 1 to 65535", what, text, port);
  endpoint.port = std::stoi(port);
  return endpoint;
}

Socket::~Socket() { close(); }

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void configure_stream(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    fail<IOError>("tcp: cannot make a socket non-blocking: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Socket listen_on(int port, double deadline, const std::string& what) {
  for (;;) {
    std::string why;
    for (const int family : {AF_INET6, AF_INET}) {
      Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (!s.valid()) {
        why = std::strerror(errno);
        continue;
      }
      const int one = 1, zero = 0;
      ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_storage address{};
      socklen_t length = 0;
      if (family == AF_INET6) {
        ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        auto* a = reinterpret_cast<sockaddr_in6*>(&address);
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons(static_cast<uint16_t>(port));
        length = sizeof(sockaddr_in6);
      } else {
        auto* a = reinterpret_cast<sockaddr_in*>(&address);
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons(static_cast<uint16_t>(port));
        length = sizeof(sockaddr_in);
      }
      if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&address), length) != 0 || ::listen(s.fd(), 256) != 0) {
        why = std::strerror(errno);
        if (errno == EADDRINUSE) break;  // retried below, in the same family
        continue;
      }
      configure_stream(s.fd());
      return s;
    }
    if (monotonic_seconds() >= deadline)
      fail<IOError>("{}: cannot listen on port {}: {}", what, port, why.empty() ? "no address family works" : why);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int local_port(const Socket& socket) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0)
    fail<IOError>("tcp: getsockname failed: {}", std::strerror(errno));
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

Socket connect_with_retry(const Endpoint& endpoint, double deadline, const std::string& what) {
  std::string last = "not tried";
  double pause = 0.05;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(endpoint.port);
    if (const int error = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); error != 0) {
      last = fmt::format("cannot resolve '{}': {}", endpoint.host, ::gai_strerror(error));
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!s.valid()) {
          last = std::strerror(errno);
          continue;
        }
        configure_stream(s.fd());
        if (const std::string error = connect_within(s.fd(), a->ai_addr, a->ai_addrlen, deadline); error.empty()) {
          ::freeaddrinfo(found);
          return s;
        } else {
          last = "connect: " + error;
        }
      }
      ::freeaddrinfo(found);
    }
    if (monotonic_seconds() >= deadline)
      fail<IOError>("{}: cannot connect to {} ({}); is it running, and is the address right?", what, endpoint.text(),
                    last);
    std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    pause = std::min(pause * 2, 1.0);
  }
}

Socket accept_until(const Socket& listener, double deadline, std::string* peer_host, const std::string& what) {
  for (;;) {
    pollfd p{listener.fd(), POLLIN, 0};
    const int ready = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (ready < 0 && errno != EINTR) fail<IOError>("{}: poll failed: {}", what, std::strerror(errno));
    if (ready > 0) {
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      const int fd = ::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC);
      if (fd >= 0) {
        Socket s(fd);
        configure_stream(fd);
        if (peer_host) *peer_host = numeric_host(address, length);
        return s;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        fail<IOError>("{}: accept failed: {}", what, std::strerror(errno));
    }
    if (monotonic_seconds() >= deadline) fail<IOError>("{}: timed out", what);
  }
}

void write_all(int fd, const void* data, size_t bytes, double deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      fail<IOError>("{}: send failed: {}", what, std::strerror(errno));
    if (monotonic_seconds() >= deadline) fail<IOError>("{}: timed out sending", what);
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1, poll_timeout_ms(deadline));
  }
}

void read_all(int fd, void* data, size_t bytes, double deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) fail<IOError>("{}: the peer closed the connection", what);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      fail<IOError>("{}: recv failed: {}", what, std::strerror(errno));
    if (monotonic_seconds() >= deadline) fail<IOError>("{}: timed out waiting for the peer", what);
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, poll_timeout_ms(deadline));
  }
}

void put_u32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint32_t get_u32(const unsigned char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}

uint64_t get_u64(const unsigned char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

}  // namespace tessera::spmd::tcp
