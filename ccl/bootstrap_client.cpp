// The bootstrap's client side: TcpBootstrap of bootstrap.h — one connection to the root,
// one round trip per all_gather(). Frames: bootstrap_wire.h.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ccl/bootstrap.h"
#include "ccl/bootstrap_wire.h"

namespace softrdma::ccl {

using namespace bootstrap_wire;  // NOLINT(google-build-using-namespace): the protocol's names
using std::chrono::milliseconds;

std::unique_ptr<TcpBootstrap> TcpBootstrap::connect(const std::string& host, uint16_t port,
                                                    uint64_t magic, int rank, int nranks,
                                                    std::chrono::milliseconds timeout) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    throw std::invalid_argument("bootstrap: rank " + std::to_string(rank) + " of " +
                                std::to_string(nranks) + " ranks");
  const std::string root = host + ":" + std::to_string(port);
  const std::string me = "rank " + std::to_string(rank);
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int g = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (g != 0) {
      last_error = std::string("cannot resolve '") + host + "': " + gai_strerror(g);
    } else {
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
          last_error = strerror(errno);
          continue;
        }
        int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          ::poll(&p, 1,
                 clock::to_real_timeout_ms(std::max(1, std::min(1000, remaining_ms(deadline)))));
          int err = ETIMEDOUT;
          socklen_t el = sizeof err;
          if (p.revents) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
          rc = err ? -1 : 0;
          errno = err;
        }
        if (rc == 0) {
          freeaddrinfo(res);
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          std::string hello;
          put_u64(hello, magic);
          put_u32(hello, static_cast<uint32_t>(nranks));
          put_u32(hello, static_cast<uint32_t>(rank));
          if (!send_all(fd, frame(kHello, hello), deadline)) {
            ::close(fd);
            throw BootstrapError(me + ": cannot send to the bootstrap root " + root);
          }
          return std::unique_ptr<TcpBootstrap>(new TcpBootstrap(fd, root, rank, nranks, timeout));
        }
        last_error = strerror(errno);
        ::close(fd);
      }
      freeaddrinfo(res);
    }
    if (Clock::now() >= deadline)
      throw BootstrapError(me + ": cannot reach the bootstrap root " + root + " within " +
                           ms_text(timeout) + ": " + last_error);
    clock::sleep_for(milliseconds(std::min(100, remaining_ms(deadline) + 1)));
  }
}

TcpBootstrap::~TcpBootstrap() {
  if (fd_ >= 0) {
    send_all(fd_, frame(kBye, ""), Clock::now() + milliseconds(1000));
    ::close(fd_);
  }
}

std::vector<std::string> TcpBootstrap::all_gather(const std::string& mine) {
  const std::string me = "rank " + std::to_string(rank_);
  if (!send_all(fd_, frame(kData, mine), Clock::now() + timeout_))
    throw BootstrapError(me + ": cannot send to the bootstrap root " + root_ + " (did it exit?)");
  // The root reports missing ranks after its own timeout: wait a little longer than it.
  const auto deadline = Clock::now() + timeout_ + milliseconds(5000);
  FrameReader in;
  for (;;) {
    uint32_t type = 0;
    std::string payload;
    bool malformed = false;
    if (in.next(type, payload, malformed)) {
      if (type == kError) throw BootstrapError(payload);
      if (type != kData) throw BootstrapError(me + ": unexpected message from " + root_);
      std::vector<std::string> out;
      size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        if (payload.size() - off < 4) throw BootstrapError(me + ": truncated reply from " + root_);
        const uint32_t len = get_u32(payload.data() + off);
        off += 4;
        if (payload.size() - off < len)
          throw BootstrapError(me + ": truncated reply from " + root_);
        out.emplace_back(payload, off, len);
        off += len;
      }
      return out;
    }
    if (malformed) throw BootstrapError(me + ": malformed reply from " + root_);
    const int left = remaining_ms(deadline);
    if (left == 0)
      throw BootstrapError(me + ": no answer from the bootstrap root " + root_ + " within " +
                           ms_text(timeout_ + milliseconds(5000)) +
                           " (waiting for the other ranks)");
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, clock::to_real_timeout_ms(std::min(left, 1000)));
    if (p.revents && !in.fill(fd_) && in.buf.size() < 8)
      throw BootstrapError(me + ": the bootstrap root " + root_ + " closed the connection");
  }
}

}  // namespace softrdma::ccl
