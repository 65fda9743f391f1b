// The address of a Linux abstract-namespace unix socket (unix(7)): the names the same-host
// path's doorbells (shm_port.cpp) and the address-sharing sockets (address_share.cpp) bind.
#pragma once

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <string>

namespace softrdma::net {

/// Fills `sa` with abstract socket `name` (sun_path: a NUL, then the name's bytes, no
/// terminator). Returns the address length to pass to bind/connect/sendto, or 0 when the
/// name does not fit (more than 107 bytes): those calls then fail with EINVAL rather than
/// reach a truncated, possibly foreign, name.
inline socklen_t abstract_unix_address(const std::string& name, sockaddr_un& sa) {
  sa = sockaddr_un{};
  sa.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof sa.sun_path) return 0;
  std::memcpy(sa.sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace softrdma::net
