// A port's data rate from its verbs attributes, and a path's bandwidth-delay product: what the
// layers above verbs (ccl's window of chunks, kv's slices per QP) size the bytes they keep in
// flight from. Header only; depends on nothing (the codes are libibverbs' values, no header
// needed).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>

namespace softrdma::link_rate {

/// The data rate of a port, bits/s, from ibv_port_attr's active_speed and active_width codes
/// (IBTA vol 1, 14.2.5.6 PortInfo LinkSpeedActive / LinkWidthActive, as libibverbs encodes
/// them: speed 1 SDR 2.5, 2 DDR 5, 4 QDR 10, 8 FDR10 10, 16 FDR 14, 32 EDR 25, 64 HDR 50,
/// 128 NDR 100 Gbit/s per lane; width 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X, 16 = 2X lanes) — the
/// figure `ibv_devinfo -v` prints as e.g. "100 Gb/sec (4X EDR)". 0 for a code it does not
/// know.
inline uint64_t port_rate_bits(uint8_t active_speed, uint8_t active_width) {
  uint64_t lane = 0;  // Mbit/s per lane
  switch (active_speed) {
    case 1:
      lane = 2'500;
      break;
    case 2:
      lane = 5'000;
      break;
    case 4:
    case 8:
      lane = 10'000;
      break;
    case 16:
      lane = 14'000;
      break;
    case 32:
      lane = 25'000;
      break;
    case 64:
      lane = 50'000;
      break;
    case 128:
      lane = 100'000;
      break;
    default:
      return 0;
  }
  uint64_t lanes = 0;
  switch (active_width) {
    case 1:
      lanes = 1;
      break;
    case 2:
      lanes = 4;
      break;
    case 4:
      lanes = 8;
      break;
    case 8:
      lanes = 12;
      break;
    case 16:
      lanes = 2;
      break;
    default:
      return 0;
  }
  return lane * lanes * 1'000'000;
}

/// Bytes in flight that fill a path of `rate_bits` bits/s and round-trip time `rtt`:
/// rate × RTT ÷ 8, saturating at UINT64_MAX. 0 when either is 0.
inline uint64_t bandwidth_delay_bytes(uint64_t rate_bits, std::chrono::nanoseconds rtt) {
  if (rate_bits == 0 || rtt.count() <= 0) return 0;
  // long double: 64 mantissa bits hold rate × RTT well enough (1.2 Tbit/s × 10 s ≈ 2^73).
  const long double bytes =
      static_cast<long double>(rate_bits) * static_cast<long double>(rtt.count()) / 8e9L;
  return bytes >= static_cast<long double>(std::numeric_limits<uint64_t>::max())
             ? std::numeric_limits<uint64_t>::max()
             : static_cast<uint64_t>(bytes);
}

}  // namespace softrdma::link_rate
