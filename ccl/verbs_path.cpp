// VerbsTransport's path measurement: each peer's RTT from zero-length RDMA WRITEs at connect
// (verbs_path.h).
#include "ccl/verbs_path.h"

#include <algorithm>

#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

using namespace verbs;  // NOLINT(google-build-using-namespace): the transport's own types

void VerbsTransport::Impl::measure_paths() {
  if (port_bits == 0) return;
  for (int round = 0; round < kPathProbes && !failed; ++round) {
    const auto start = Clock::now();
    for (Peer& P : peers) {
      if (!P.connected() || P.dead || P.closed || P.ch[0].sq_free < 1) continue;
      // Timed before the post: the packet may leave before ibv_post_send returns, and a
      // thread descheduled between the two read an RTT shorter than the path (49.7 ms through
      // an emulated 25 ms each way, under load).
      const auto sent = Clock::now();
      if (!post_zero_write(P, kPathProbeIndex, "path probe")) return;
      P.path_probe_sent = sent;
      P.path_probe_pending = true;
    }
    // Busy-poll for up to kPathSpin, then wait as any blocked call does (naps and channel
    // sleeps), bounded by the transport's timeout; a peer that does not answer fails through
    // its probe's error completion (retry_cnt exceeded), reported by the first collective.
    // Spinning first keeps the wake-up of a sleeping thread out of a short path's RTT (on a
    // loaded 2-core machine that alone is 2–4 ms, a scheduler tick, against ~10 µs).
    // A peer that said goodbye (connected and left at once) is not waited for: its probe
    // may only come back as an error after the retransmissions.
    const auto none_pending = [&] {
      return std::none_of(peers.begin(), peers.end(), [](const Peer& P) {
        return P.path_probe_pending && !P.closed && !P.dead;
      });
    };
    while (!failed && !none_pending() && Clock::now() - start < kPathSpin) poll_once();
    const auto deadline = start + opt.timeout;
    progress_until([&] { return none_pending() || Clock::now() >= deadline; }, -1, start);
  }
}

uint64_t VerbsTransport::Impl::path_bytes(int peer) const {
  if (peer < 0 || peer >= size || peer == rank) return 0;
  return link_rate::bandwidth_delay_bytes(port_bits, peers[static_cast<size_t>(peer)].path_rtt);
}

}  // namespace softrdma::ccl
