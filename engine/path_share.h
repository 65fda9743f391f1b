// What the QPs of one device towards one peer share: the rate their ACK-train jumps have
// already claimed (CongestionWindow's jump to one measured BDP), and one window's worth of
// PSNs in flight on a long path. RFC 2140's ensemble sharing and RFC 3124's Congestion
// Manager keep such state per destination host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

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

  /// PSNs a QP may always keep in flight, whatever the others hold (CongestionWindow's
  /// first window): a QP that starts beside busy ones is never shut out.
  static constexpr uint32_t kMinFlightPsns = 128;
  /// The PSNs QP `id` may have in flight at `now_ns`, given its own congestion window
  /// (`window`) and what it has in flight (`in_flight`), both PSNs. The QPs that asked
  /// within their `hold_ns` (2 smoothed RTTs: a QP with work runs at every ACK) hold
  /// together at most the largest of their windows: each window is what its QP would keep
  /// alone on the path, and n of them side by side kept n times that — kv's 2 QPs on
  /// 100 Gbit/s × 50 ms held 166,000 + 226,000 PSNs, 2.6 BDPs, into a path and queue of 2,
  /// and overflowed it twice per 10 GiB. Each gets at least an even share of that window
  /// (largest / active QPs) and as much more as the others leave unused — RFC 3124's
  /// Congestion Manager shares one window among a host's flows to a peer the same way —
  /// and at least kMinFlightPsns. `rate`: the QP's latest delivery rate (PSNs per ns),
  /// summed by path_rate(). Returns the cap (PSNs) and the even share (largest / active QPs, PSNs).
  struct Flight {
    uint32_t cap;   // PSNs the QP may have in flight
    uint32_t even;  // the shared window's even share, PSNs
  };
  Flight flight_cap(uint32_t id, uint32_t window, uint32_t in_flight, double rate, uint64_t now_ns,
                    uint64_t hold_ns) {
    bool found = false;
    uint32_t largest = window, active = 0;
    uint64_t others = 0;
    for (size_t i = 0; i < members_.size();) {
      Member& m = members_[i];
      if (m.id == id) {
        m = Member{id, window, in_flight, rate, now_ns, hold_ns};
        found = true;
      } else if (now_ns > m.seen_ns && now_ns - m.seen_ns > m.hold_ns) {
        m = members_.back();  // gone quiet: its share goes to the others
        members_.pop_back();
        continue;
      } else {
        others += m.in_flight;
      }
      largest = std::max(largest, m.window);
      ++active;
      ++i;
    }
    if (!found) {
      members_.push_back(Member{id, window, in_flight, rate, now_ns, hold_ns});
      ++active;
    }
    const uint64_t left = largest > others ? largest - others : 0;
    const uint32_t even = largest / active;
    return {static_cast<uint32_t>(std::max<uint64_t>({kMinFlightPsns, even, left})), even};
  }
  /// The delivery rates the QPs sharing the path's window (flight_cap) last reported, summed:
  /// the path's rate as they carry it together, PSNs per ns (0: none).
  double path_rate() const {
    double sum = 0;
    for (const Member& m : members_) sum += m.rate;
    return sum;
  }

 private:
  struct Member {
    uint32_t id;         // the QP's number
    uint32_t window;     // its congestion window when it last asked, PSNs
    uint32_t in_flight;  // its PSNs in flight then
    double rate;         // its latest delivery rate then, PSNs per ns
    uint64_t seen_ns;    // when it last asked
    uint64_t hold_ns;    // how long its ask counts
  };
  std::vector<Member> members_;  // QPs that asked flight_cap recently
  double claimed_ = 0;           // bytes per ns claimed by jumps since the claims were last reset
  uint32_t claims_ = 0;          // jumps counted in claimed_
  uint64_t until_ns_ = 0;        // the claims lapse then, ns
};

}  // namespace softrdma::engine
