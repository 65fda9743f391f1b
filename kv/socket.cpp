// Blocking TCP helpers with deadlines (socket.h).
#include "kv/socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace softrdma::kv::tcp {

namespace {

addrinfo* resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res))
    throw std::runtime_error("cannot resolve '" + host + "': " + gai_strerror(rc));
  return res;
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::release() {
  int f = fd_;
  fd_ = -1;
  return f;
}

Fd connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline, bool retry) {
  addrinfo* res = resolve(host, port, false);
  int last = ETIMEDOUT;
  for (;;) {
    Fd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) {
      last = errno;
      break;
    }
    if (::connect(fd.get(), res->ai_addr, res->ai_addrlen) == 0) {
      int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      freeaddrinfo(res);
      return fd;
    }
    last = errno;
    if (!retry || base::remaining_ms(deadline) == 0) break;
    clock::sleep_for(std::chrono::milliseconds(20));
  }
  freeaddrinfo(res);
  throw std::runtime_error("cannot connect to " + host + ":" + std::to_string(port) + ": " +
                           std::strerror(last));
}

Fd listen_tcp(const std::string& host, uint16_t port, uint16_t& bound_port) {
  addrinfo* res = resolve(host, port, true);
  Fd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (!fd || ::bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd.get(), 64) != 0) {
    const int e = errno;
    freeaddrinfo(res);
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " +
                             std::strerror(e));
  }
  freeaddrinfo(res);
  sockaddr_in a{};
  socklen_t len = sizeof a;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  bound_port = ntohs(a.sin_port);
  return fd;
}

Fd accept_tcp(int listener, int timeout_ms) {
  pollfd p{listener, POLLIN, 0};
  if (::poll(&p, 1, clock::to_real_timeout_ms(timeout_ms)) <= 0) return Fd();
  Fd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (fd) {
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t get_u32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<uint8_t>(s.at(at + static_cast<size_t>(i)))) << (8 * i);
  return v;
}

void put_u64(std::string& s, uint64_t v) {
  put_u32(s, static_cast<uint32_t>(v));
  put_u32(s, static_cast<uint32_t>(v >> 32));
}

uint64_t get_u64(std::string_view s, size_t at) {
  return get_u32(s, at) | (static_cast<uint64_t>(get_u32(s, at + 4)) << 32);
}

void put_bytes(std::string& s, std::string_view b) {
  put_u32(s, static_cast<uint32_t>(b.size()));
  s.append(b);
}

}  // namespace softrdma::kv::tcp
