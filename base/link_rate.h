// A port's data rate from its verbs attributes, and a path's bandwidth-delay product: what the
// layers above verbs (ccl's window of chunks, kv's slices per QP) size the bytes they keep in
// flight from. Header only; depends on nothing (the codes are libibverbs' values, no header
// needed).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

namespace softrdma::link_rate {

namespace detail {
/// One lane's signalling rate per IBTA speed code (IBTA vol 1, 14.2.5.6 LinkSpeedActive, as
/// libibverbs encodes it), in 0.1 Gbit/s, and the name ib_core's sysfs gives it.
struct LaneSpeed {
  uint8_t code;
  uint16_t tenths_gbit;
  const char* name;
};
inline constexpr std::array<LaneSpeed, 8> kLaneSpeeds{{{1, 25, "SDR"},
                                                       {2, 50, "DDR"},
                                                       {4, 100, "QDR"},
                                                       {8, 100, "FDR10"},
                                                       {16, 140, "FDR"},
                                                       {32, 250, "EDR"},
                                                       {64, 500, "HDR"},
                                                       {128, 1000, "NDR"}}};
/// Lanes per IBTA width code (LinkWidthActive): 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X, 16 = 2X.
struct Width {
  uint8_t code;
  uint8_t lanes;
};
inline constexpr std::array<Width, 5> kWidths{{{1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}}};

inline const LaneSpeed* lane_speed(uint8_t code) {
  for (const LaneSpeed& s : kLaneSpeeds)
    if (s.code == code) return &s;
  return nullptr;
}
inline const Width* width(uint8_t code) {
  for (const Width& w : kWidths)
    if (w.code == code) return &w;
  return nullptr;
}
}  // namespace detail

/// The data rate of a port, bits/s, from ibv_port_attr's active_speed and active_width codes
/// (IBTA vol 1, 14.2.5.6 PortInfo LinkSpeedActive / LinkWidthActive, as libibverbs encodes
/// them: speed 1 SDR 2.5, 2 DDR 5, 4 QDR 10, 8 FDR10 10, 16 FDR 14, 32 EDR 25, 64 HDR 50,
/// 128 NDR 100 Gbit/s per lane; width 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X, 16 = 2X lanes) — the
/// figure `ibv_devinfo -v` prints as e.g. "100 Gb/sec (4X EDR)". 0 for a code it does not
/// know.
inline uint64_t port_rate_bits(uint8_t active_speed, uint8_t active_width) {
  const detail::LaneSpeed* s = detail::lane_speed(active_speed);
  const detail::Width* w = detail::width(active_width);
  if (!s || !w) return 0;
  return uint64_t{s->tenths_gbit} * w->lanes * 100'000'000;
}

/// A port's rate as verbs states it: ibv_port_attr's active_speed and active_width codes (the
/// encoding port_rate_bits reads).
struct PortSpeed {
  uint8_t active_speed;
  uint8_t active_width;
  bool operator==(const PortSpeed&) const = default;
};

/// The port a softrdma device reports when no emulated link gives it a rate: 4X EDR,
/// 100 Gbit/s (a common RoCE NIC).
inline constexpr PortSpeed kDefaultPortSpeed{32, 2};

/// The slowest standard port (IBTA vol 1, 14.2.5.6: 1X SDR 2.5 … 12X NDR 1,200 Gbit/s; the
/// rates `ibv_devinfo` and ib_core's sysfs print) whose rate is at least `bits` bits/s —
/// the port of a NIC that feeds a link of that rate: 10 Gbit/s → 1X QDR, 100 → 4X EDR,
/// 400 → 4X NDR. 0 (no rate) gives kDefaultPortSpeed; above 1.2 Tbit/s, 12X NDR.
inline PortSpeed port_speed_for_rate(uint64_t bits) {
  if (bits == 0) return kDefaultPortSpeed;
  // In rising order of rate (speed code, width code): 1X SDR, 1X DDR, 1X QDR, 1X FDR,
  // 1X EDR, 4X QDR, 1X HDR, 4X FDR, 4X EDR, 4X HDR, 4X NDR, 8X NDR, 12X NDR.
  // clang-format off
  static constexpr std::array<PortSpeed, 13> kPorts{{
      {1, 1}, {2, 1}, {4, 1}, {16, 1}, {32, 1}, {4, 2}, {64, 1}, {16, 2}, {32, 2}, {64, 2},
      {128, 2}, {128, 4}, {128, 8}}};
  // clang-format on
  for (const PortSpeed& p : kPorts)
    if (port_rate_bits(p.active_speed, p.active_width) >= bits) return p;
  return kPorts.back();
}

/// The port's rate as ib_core's sysfs `ports/N/rate` file spells it (drivers/infiniband/core/
/// sysfs.c, rate_show; no newline): "100 Gb/sec (4X EDR)", "2.5 Gb/sec (1X SDR)",
/// "56 Gb/sec (4X FDR)". Codes port_rate_bits does not know read as SDR / 1X, as there.
inline std::string port_rate_text(PortSpeed p) {
  const detail::LaneSpeed* s = detail::lane_speed(p.active_speed);
  const detail::Width* w = detail::width(p.active_width);
  if (!s) s = &detail::kLaneSpeeds[0];
  const unsigned lanes = w ? w->lanes : 1;
  const unsigned rate = s->tenths_gbit * lanes;
  return std::to_string(rate / 10) + (rate % 10 ? ".5" : "") + " Gb/sec (" + std::to_string(lanes) +
         "X " + s->name + ")";
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
