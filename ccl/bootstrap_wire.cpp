// The bootstrap's frames and socket helpers (bootstrap_wire.h).
#include "ccl/bootstrap_wire.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace softrdma::ccl::bootstrap_wire {

using std::chrono::milliseconds;

std::string ms_text(milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

void put_u32(std::string& s, uint32_t v) {
  v = htonl(v);
  s.append(reinterpret_cast<const char*>(&v), 4);
}
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}
void put_u64(std::string& s, uint64_t v) {
  put_u32(s, static_cast<uint32_t>(v >> 32));
  put_u32(s, static_cast<uint32_t>(v));
}
uint64_t get_u64(const char* p) {
  return (static_cast<uint64_t>(get_u32(p)) << 32) | get_u32(p + 4);
}

std::string frame(uint32_t type, const std::string& payload) {
  std::string s;
  put_u32(s, type);
  put_u32(s, static_cast<uint32_t>(payload.size()));
  return s + payload;
}

bool FrameReader::next(uint32_t& type, std::string& payload, bool& malformed) {
  malformed = false;
  if (buf.size() < 8) return false;
  const uint32_t len = get_u32(buf.data() + 4);
  if (len > kMaxFrame) {
    malformed = true;
    return false;
  }
  if (buf.size() < 8 + static_cast<size_t>(len)) return false;
  type = get_u32(buf.data());
  payload.assign(buf, 8, len);
  buf.erase(0, 8 + static_cast<size_t>(len));
  return true;
}

bool FrameReader::fill(int fd) {
  char tmp[65536];
  for (;;) {
    ssize_t n = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n > 0) {
      buf.append(tmp, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof tmp) return true;
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

}  // namespace softrdma::ccl::bootstrap_wire
