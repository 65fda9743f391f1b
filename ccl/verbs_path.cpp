// VerbsTransport's path measurement: each peer's RTT from zero-length RDMA WRITEs at connect
// (verbs_path.h), and the port-rate arithmetic.
#include "ccl/verbs_path.h"

#include <algorithm>
#include <limits>

#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

namespace verbs {

uint64_t port_rate_bits(uint8_t active_speed, uint8_t active_width) {
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

uint64_t bandwidth_delay_bytes(uint64_t rate_bits, std::chrono::nanoseconds rtt) {
  if (rate_bits == 0 || rtt.count() <= 0) return 0;
  // long double: 64 mantissa bits hold rate × RTT exactly enough (1.2 Tbit/s × 10 s ≈ 2^73).
  const long double bytes =
      static_cast<long double>(rate_bits) * static_cast<long double>(rtt.count()) / 8e9L;
  return bytes >= 18446744073709551615.0L ? std::numeric_limits<uint64_t>::max()
                                          : static_cast<uint64_t>(bytes);
}

}  // namespace verbs

using namespace verbs;  // NOLINT(google-build-using-namespace): the transport's own types

void VerbsTransport::Impl::measure_paths() {
  if (port_bits == 0) return;
  for (int round = 0; round < kPathProbes && !failed; ++round) {
    const auto start = Clock::now();
    for (Peer& P : peers) {
      if (!P.connected() || P.dead || P.closed || P.ch[0].sq_free < 1) continue;
      ibv_send_wr wr{};
      wr.wr_id = make_wr_id(Kind::kProbe, P.rank, kPathProbeIndex);
      wr.num_sge = 0;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad = nullptr;
      if (int e = ibv_post_send(P.ch[0].qp, &wr, &bad)) {
        peer_failed(P.rank, "ibv_post_send(path probe) failed: " + errno_text(e));
        return;
      }
      --P.ch[0].sq_free;
      P.path_probe_sent = Clock::now();
      P.path_probe_pending = true;
    }
    // Busy-poll for up to kPathSpin, then wait as any blocked call does (naps and channel
    // sleeps), bounded by the transport's timeout; a peer that does not answer fails through
    // its probe's error completion (retry_cnt exceeded), reported by the first collective.
    // Spinning first keeps the wake-up of a sleeping thread out of a short path's RTT (on a
    // loaded 2-core machine that alone is 2–4 ms, a scheduler tick, against ~10 µs).
    const auto none_pending = [&] {
      return std::none_of(peers.begin(), peers.end(),
                          [](const Peer& P) { return P.path_probe_pending; });
    };
    while (!failed && !none_pending() && Clock::now() - start < kPathSpin) poll_once();
    const auto deadline = start + opt.timeout;
    progress_until([&] { return none_pending() || Clock::now() >= deadline; }, -1, start);
  }
}

uint64_t VerbsTransport::Impl::path_bytes(int peer) const {
  if (peer < 0 || peer >= size || peer == rank) return 0;
  return bandwidth_delay_bytes(port_bits, peers[static_cast<size_t>(peer)].path_rtt);
}

}  // namespace softrdma::ccl
