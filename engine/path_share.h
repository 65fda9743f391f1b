// What the QPs of one device starting towards one peer share: the rate their ACK-train
// jumps have already claimed (CongestionWindow's jump to one measured BDP). RFC 2140's
// ensemble sharing and RFC 3124's Congestion Manager keep such state per destination host;
// this keeps only the start-up claim, for a few round trips.
#pragma once

#include <algorithm>
#include <cstdint>

namespace softrdma::engine {

/// The path from one device to one peer address, as the ACK-train jumps of its QPs claimed
/// it. Each QP's first ACK train measures the rate its own flight left at; flights of QPs
/// that start together but do not overlap at the bottleneck (kv's two QPs, each a 128-PSN
/// burst lasting 42 µs at 100 Gbit/s) each measure the whole link, and each jumping to a
/// whole BDP put two in flight: over 100 Gbit/s × 50 ms at TDF 200, the one-BDP queue
/// overflowed at start-up. So a jump asks take(): the rate it measured less what other QPs
/// claimed within the last hold, but at least a fair share (measured / (claims + 1)), as
/// RFC 2140 divides a cached window among the connections of an ensemble — and all claims
/// together at most kMaxClaimed times the rate measured: the jumps put at most 1.5 BDPs in
/// flight, as one QP's slow start ends at 1.5 BDPs (CongestionWindow::on_acked). Two QPs
/// get 1 and 1/2 BDP, a third none (it goes on in slow start); the next trains see the link
/// shared, and note_train's validation takes back a window above 1.5 BDPs of what they show.
/// Erring low costs round trips of slow start; erring high, a queue overflow.
/// Not thread-safe: the device lock guards it (Transport::path_share).
class PathShare {
 public:
  /// All claims within a hold together: at most this many times the rate a jump measured.
  static constexpr double kMaxClaimed = 1.5;
  /// A QP's jump at `now_ns` on a measured rate of `measured` bytes per ns; the claim holds
  /// until `now_ns + hold_ns` (2 smallest RTTs: by then the next trains validate the jumps,
  /// CongestionWindow::note_train). Returns the rate to jump on, bytes per ns, 0 … measured
  /// (0: no jump).
  double take(double measured, uint64_t now_ns, uint64_t hold_ns) {
    if (now_ns >= until_ns_) {
      claimed_ = 0;
      claims_ = 0;
    }
    const double rate = std::max(
        0.0, std::min({measured, std::max(measured - claimed_, measured / double(claims_ + 1)),
                       kMaxClaimed * measured - claimed_}));
    claimed_ += rate;
    ++claims_;
    until_ns_ = std::max(until_ns_, now_ns + hold_ns);
    return rate;
  }
  /// Claimed rate still held at `now_ns`, bytes per ns.
  double claimed(uint64_t now_ns) const { return now_ns < until_ns_ ? claimed_ : 0; }

 private:
  double claimed_ = 0;     // bytes per ns claimed by jumps since the claims were last reset
  uint32_t claims_ = 0;    // jumps counted in claimed_
  uint64_t until_ns_ = 0;  // the claims lapse then, ns
};

}  // namespace softrdma::engine
