#include "base/deadline_socket.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>

namespace softrdma::base {

int remaining_ms(clock::Steady::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::Steady::now())
          .count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1'000'000'000));
}

bool send_all(int fd, std::string_view data, clock::Steady::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int left = remaining_ms(deadline);
      if (left == 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, clock::to_real_timeout_ms(left));
      continue;
    }
    return false;
  }
  return true;
}

bool recv_exact(int fd, size_t n, std::string& out, clock::Steady::time_point deadline) {
  out.resize(n);
  size_t off = 0;
  while (off < n) {
    const ssize_t r = ::recv(fd, out.data() + off, n - off, MSG_DONTWAIT);
    if (r > 0) {
      off += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const int left = remaining_ms(deadline);
    if (left == 0) return false;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, clock::to_real_timeout_ms(std::min(left, 1000)));
  }
  return true;
}

}  // namespace softrdma::base
