// An IPv4 address as text, for names built from an address (files in /dev/shm, sysfs keys,
// environment values). Header-only: the LD_PRELOAD libraries use it too.
#pragma once

#include <cstdint>
#include <string>

namespace softrdma::base {

/// "a.b.c.d" for the host-order address `ip` (the most significant byte first, as
/// inet_ntop writes it).
inline std::string ipv4_text(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string((ip >> 16) & 0xff) + "." +
         std::to_string((ip >> 8) & 0xff) + "." + std::to_string(ip & 0xff);
}

}  // namespace softrdma::base
