// The path to each peer as VerbsTransport sees it (internal to ccl/): the local port's rate
// and the round-trip time measured at connect, whose product — the bandwidth-delay product —
// is Transport::path_bytes(), from which the collectives size their window of chunks in
// flight (Config::depth_from_path).
#pragma once

#include <chrono>
#include <cstdint>

namespace softrdma::ccl::verbs {

/// Zero-length RDMA WRITEs timed per peer at connect; the path's RTT is the smallest.
inline constexpr int kPathProbes = 5;
/// How long the prober busy-polls for its probes' completions before it sleeps between
/// polls (verbs_path.cpp says why).
inline constexpr std::chrono::microseconds kPathSpin{2000};
/// The wr_id index of those probes (Kind::kProbe; the liveness probes use 0).
inline constexpr uint64_t kPathProbeIndex = 1;

/// The data rate of a port, bits/s, from ibv_port_attr's active_speed and active_width
/// codes (IBTA vol 1, 14.2.5.6 PortInfo LinkSpeedActive / LinkWidthActive, as libibverbs
/// encodes them: speed 1 SDR 2.5, 2 DDR 5, 4 QDR 10, 8 FDR10 10, 16 FDR 14, 32 EDR 25,
/// 64 HDR 50, 128 NDR 100 Gbit/s per lane; width 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X, 16 = 2X
/// lanes) — the figure `ibv_devinfo -v` prints as e.g. "100 Gb/sec (4X EDR)". 0 for a code it
/// does not know.
uint64_t port_rate_bits(uint8_t active_speed, uint8_t active_width);

/// Bytes in flight that fill a path of `rate_bits` bits/s and round-trip time `rtt`:
/// rate × RTT ÷ 8, saturating. 0 when either is 0.
uint64_t bandwidth_delay_bytes(uint64_t rate_bits, std::chrono::nanoseconds rtt);

}  // namespace softrdma::ccl::verbs
