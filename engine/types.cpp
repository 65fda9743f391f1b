#include "engine/types.h"

#include <cstring>

namespace softrdma::engine {

Gid Gid::from_ipv4(uint32_t ip) {
  Gid g;
  g.raw[10] = 0xff;
  g.raw[11] = 0xff;
  g.raw[12] = static_cast<uint8_t>(ip >> 24);
  g.raw[13] = static_cast<uint8_t>(ip >> 16);
  g.raw[14] = static_cast<uint8_t>(ip >> 8);
  g.raw[15] = static_cast<uint8_t>(ip);
  return g;
}

bool Gid::to_ipv4(uint32_t& ip) const {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(raw, kPrefix, sizeof kPrefix) != 0) return false;
  ip = (uint32_t{raw[12]} << 24) | (uint32_t{raw[13]} << 16) | (uint32_t{raw[14]} << 8) | raw[15];
  return true;
}

}  // namespace softrdma::engine
