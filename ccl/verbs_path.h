// The path to each peer as VerbsTransport sees it (internal to ccl/): the local port's rate
// and the round-trip time measured at connect, whose product — the bandwidth-delay product —
// is Transport::path_bytes() (base/link_rate.h has the arithmetic), from which the collectives size
// their window of chunks in flight (Config::depth_from_path).
#pragma once

#include <chrono>
#include <cstdint>

#include "base/link_rate.h"

namespace softrdma::ccl::verbs {

/// Zero-length RDMA WRITEs timed per peer at connect; the path's RTT is the smallest.
inline constexpr int kPathProbes = 5;
/// How long the prober busy-polls for its probes' completions before it sleeps between
/// polls (verbs_path.cpp says why).
inline constexpr std::chrono::microseconds kPathSpin{2000};
/// The wr_id index of those probes (Kind::kProbe; the liveness probes use 0).
inline constexpr uint64_t kPathProbeIndex = 1;

}  // namespace softrdma::ccl::verbs
