#include "cm/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "wire/roce.h"

namespace softrdma::cm {

uint32_t route_source(uint32_t dst, int& err) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
    return 0;
  }
  sockaddr_in to{};
  make_sockaddr(to, dst, wire::kRoceV2Port);
  uint32_t src = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0)
      src = ntohl(me.sin_addr.s_addr);
    else
      err = errno;
  } else {
    err = errno;
  }
  ::close(fd);
  return src;
}

bool is_local_address(uint32_t ip) {
  if ((ip >> 24) == 127) return true;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i && !found; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET)
      found = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr) == ip;
  ::freeifaddrs(list);
  return found;
}

namespace {

/// One pass over /proc/net/udp: whether a row has local address `ip` (or 0.0.0.0) and port
/// 4791.
bool udp_row_at(uint32_t ip) {
  // /proc/net/udp rows: "sl local_address rem_address st ...", local_address as the
  // hexadecimal of the 32-bit word in memory (network order read as a host integer) ":" port.
  std::ifstream in("/proc/net/udp");
  std::string line;
  std::getline(in, line);  // header
  for (int rows = 0; rows < 1'000'000 && std::getline(in, line); ++rows) {
    std::istringstream row(line);
    std::string sl, local;
    if (!(row >> sl >> local)) continue;
    unsigned addr = 0, port = 0;
    if (std::sscanf(local.c_str(), "%8X:%4X", &addr, &port) != 2) continue;
    if (port != wire::kRoceV2Port) continue;
    const uint32_t bound = ntohl(addr);
    if (bound == ip || bound == 0) return true;
  }
  return false;
}

}  // namespace

bool roce_endpoint_at(uint32_t ip) {
  // The kernel produces /proc/net/udp a page per read(2) and walks the socket table again
  // from the start for each page: a socket closed meanwhile in an earlier bucket shifts the
  // rest, and a row can be skipped (seen as a spurious RDMA_CM_EVENT_ADDR_ERROR when many
  // processes open and close sockets at once). A present socket is missed only by such a
  // race, so a miss is confirmed by two more passes.
  for (int pass = 0; pass < 3; ++pass)
    if (udp_row_at(ip)) return true;
  return false;
}

ibv_gid ipv4_gid(uint32_t ip) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = uint8_t(ip >> 24);
  g.raw[13] = uint8_t(ip >> 16);
  g.raw[14] = uint8_t(ip >> 8);
  g.raw[15] = uint8_t(ip);
  return g;
}

uint32_t gid_ipv4(const uint8_t (&raw)[16]) {
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(raw, kMapped, sizeof kMapped) != 0) return 0;
  return uint32_t(raw[12]) << 24 | uint32_t(raw[13]) << 16 | uint32_t(raw[14]) << 8 | raw[15];
}

std::string ip_string(uint32_t ip) {
  char buf[INET_ADDRSTRLEN];
  in_addr a{htonl(ip)};
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

bool sockaddr_ipv4(const sockaddr* sa, uint32_t& ip, uint16_t& port) {
  if (!sa || sa->sa_family != AF_INET) return false;
  const auto* sin = reinterpret_cast<const sockaddr_in*>(sa);
  ip = ntohl(sin->sin_addr.s_addr);
  port = ntohs(sin->sin_port);
  return true;
}

void make_sockaddr(sockaddr_in& sin, uint32_t ip, uint16_t port) {
  sin = sockaddr_in{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(ip);
  sin.sin_port = htons(port);
}

}  // namespace softrdma::cm
