// The requester's congestion window: how many PSNs may be in flight. Slow start and
// additive increase / multiplicative decrease as TCP's (RFC 5681), in PSNs instead of bytes.
// Owned by the requester (RequesterState); the completer reports what the ACKs said.
// A type of its own, as UCX keeps its RC flow-control window (uct_rc_fc_t), so every
// change of the window is one of the named events below.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/path_share.h"

namespace softrdma::engine {

/// PSNs in flight, 1 … kMaxPsns. Starts at kInitialPsns (rxe's fixed window) and grows
/// with the path: by every newly acknowledged PSN below the slow-start threshold (doubling
/// per round trip), by one PSN per window's worth of acknowledged PSNs above it. A loss
/// (sequence or selective NAK) halves it and sets the threshold there; a retransmit timeout
/// restarts from one PSN. So a long fat link is filled (10 Gbit/s × 20 ms = 25 MB ≈ 6,100
/// PSNs of 4 KiB) instead of the 128 PSNs per round trip a fixed window allowed (52 MB/s at
/// 10 ms RTT). Besides pacing, a window that changes between go-back-N rounds cannot keep
/// losing the same packet under periodic loss, which a fixed window did.
///
/// On a long path (long_path(): smallest RTT ≥ kTrainMinRttNs, not host-local) the ACK train of
/// each slow-start round measures the path. A window-limited flight leaves as a burst, the
/// bottleneck spaces its packets and the ACKs return so spaced (Jacobson 1988's self-clocking;
/// packet-train dispersion, Keshav 1991; HyStart's ACK train, Ha & Rhee 2011; BBR's delivery rate
/// from ACKs, Cardwell et al. 2016): the PSNs acknowledged after the train's first ACK over the
/// time since it — at least kTrainMinPsns over kTrainMinNs — are a rate the path carried.
/// While a train comes back the window is raised towards that rate × the smallest RTT (one
/// measured BDP), at most kTrainGain times what it was when the train began and within the
/// slow-start threshold; once the first measured train is over (the next one begins), the
/// window jumps to one BDP of its rate — paced at kTrainPacingGain × that rate, so the jump
/// leaves at about the path's rate rather than as a burst (Jump Start, Liu et al.,
/// PFLDnet 2007) — and slow start goes on from there. Spread by the bottleneck or by a
/// slower sender, the estimate is at most the bottleneck's rate, so the jump puts at most
/// about one BDP in flight; ACK compression is what could inflate it, hence the minimum
/// spread and the validation: a later train showing less than the first one's rate, over a
/// quarter of a BDP of what it showed, ends slow start at 1.5 BDPs of it. A train is the
/// dispersion of one flight, so a pause bounds it at both ends: an ACK of a lone packet sent
/// before the sender ran dry and paused does not start one (on_delivered's train_origin),
/// and an ACK after a pause in the train's ACKs ends it (note_train). 10 Gbit/s ×
/// 50 ms (15,259 PSNs) is reached in 2 round trips instead of 7, 100 Gbit/s × 50 ms in 2
/// instead of 11, where the trains are measurable: the 96 PSNs after the first ACK of a
/// 128-PSN flight span 20 µs only up to ~150 Gbit/s at MTU 4096, so at 400 Gbit/s the
/// first round doubles and the jump follows the second's train. Short paths
/// (data centre) and host-local ones (set_host_local: a peer on this host, whatever its
/// round trip measures under load) keep plain slow start from kInitialPsns: a round trip
/// costs microseconds there, and a same-host ring that overflows is a local drop
/// (on_local_drop).
class CongestionWindow {
 public:
  /// The first window, PSNs (rxe's fixed 128-PSN window; RFC 6928's initial window is 10
  /// segments, this one 512 KiB at MTU 4096 — the ACK-train jump, not a larger guess, is
  /// what fills a long path).
  static constexpr uint32_t kInitialPsns = 128;
  /// The largest window, PSNs: 2^22 (4.19 M PSNs, 16 GiB at MTU 4096). 400 Gbit/s × 100 ms
  /// is 5 GB, 1.22 M PSNs of 4 KiB, and a loss keeps up to 1.5 measured BDPs in flight
  /// (on_sequence_nak): 1.83 M, close to 2^21, and a measured rate may overshoot the
  /// link's. Half of the 2^23 at which the 24-bit PSNs of a
  /// window's two ends stop telling "ahead" from "behind" (IBTA vol 1 9.7.1), so a responder
  /// still tells a resend up to a window behind from a packet up to a window ahead. The
  /// responder's out-of-order tracking spans as many PSNs at most
  /// (ReceivedPsns::kMaxSpanPsns), growing only as far as a loss opens it.
  static constexpr uint32_t kMaxPsns = 1u << 22;
  /// The ACK-train jump applies on paths whose smallest RTT is at least this long, ns.
  static constexpr uint64_t kTrainMinRttNs = 1'000'000;
  /// In slow start after a train, the requester paces at this many times the train's rate
  /// (requester.cpp pacing_rate): bursts of a raised window leave at about the path's rate,
  /// and the next train can still show a faster path (BBR's startup paces at 2.89× its
  /// estimate, Cardwell et al. 2016; 1.25 is its probing gain).
  static constexpr double kTrainPacingGain = 1.25;
  /// PSNs the train must acknowledge after its first ACK before its rate counts.
  static constexpr uint32_t kTrainMinPsns = 64;
  /// Time the train must spread over after its first ACK before its rate counts, ns.
  static constexpr uint64_t kTrainMinNs = 20'000;
  /// While it comes back, a train raises the window to at most this many times what it was
  /// when the train began: the requester paces only once a train has measured the path, and
  /// an unpaced raise leaves as one burst (an unbounded one sent a whole 16 MiB transfer at
  /// once and drew drops no counter saw — most likely the receive socket buffer — in
  /// WanBulkWrite under load). The jump at the first train's end is paced, so uncapped.
  static constexpr uint32_t kTrainGain = 4;

  /// Delivery-rate samples kept (one per interval of at least a minimum RTT); the path's
  /// bandwidth is the largest of them, as BBR's windowed max filter (Cardwell et al.,
  /// ACM Queue 2016), so it forgets a rate the path no longer carries.
  static constexpr size_t kRateSamples = 8;
  /// A round trip longer than the smallest by more than 1/kQueueDelayFraction of it shows a
  /// standing queue (12.5 ms at 50 ms: a quarter of a one-BDP bottleneck queue, well above
  /// the emulator's and a loaded host's jitter of a few ms).
  static constexpr uint64_t kQueueDelayFraction = 4;
  /// PSNs lost within one smallest RTT beyond 1/kRandomLossFraction of the window are
  /// congestion even without a measured queue (1.6 %: a 1 % random loss stays below it; a
  /// queue overflowing under slow start drops up to half a window).
  static constexpr uint32_t kRandomLossFraction = 64;
  /// A pause of more than 1/this of the smallest RTT separates two flights (idle_gap_ns).
  static constexpr uint64_t kIdleGapDivisor = 8;
  /// An ACK after a pause longer than idle_gap_ns() and this many times the train's mean ACK
  /// spacing ends the slow-start round's train (note_train): it is for PSNs sent after a
  /// pause of the sender's own, not part of the flight the train times.
  static constexpr uint64_t kTrainPauseSpacings = 8;
  /// Congestion avoidance on a long path with no queue grows the window by 1/this of itself
  /// per round trip (on_acked).
  static constexpr uint32_t kFreeGrowthDivisor = 8;

  /// The congestion window, PSNs.
  uint32_t psns() const { return psns_; }
  /// PSNs this QP may have in flight now: its window, or less while QPs towards the same
  /// peer on a long path share one window (share_flight).
  uint32_t flight_psns() const { return std::min(psns_, flight_cap_); }
  /// Asks the path's share (set_path_share) what this QP, number `id`, with `in_flight`
  /// PSNs in flight, may keep in flight at `now_ns` (PathShare::flight_cap) — on a long path
  /// only; elsewhere, and without a share, flight_psns() is the window. A window below the
  /// even share of the QPs' largest is raised to it (the QPs keep one window between them).
  /// The requester asks at each run with work to send.
  void share_flight(uint32_t id, uint32_t in_flight, uint64_t now_ns) {
    if (!share_ || !long_path() || !srtt_ns_) {
      flight_cap_ = kMaxPsns;
      return;
    }
    const PathShare::Flight f =
        share_->flight_cap(id, psns_, in_flight, latest_rate(), now_ns, 2 * srtt_ns_);
    sharing_ = f.cap < psns_ || share_->path_rate() > latest_rate();
    // The QPs' windows are one window: a QP in congestion avoidance whose own is below its
    // even share of it (its slow start ended early on a train a busy sender spread: kv's QP 1
    // measured 26 Gbit/s of a 100 Gbit/s path, stopped at 60,000 PSNs and grew 12.5 % per
    // round trip for 6 of them while QP 0's window said 158,000) takes the share. Not in slow
    // start: there its ACK-train jump takes what the others' jumps left (PathShare::take),
    // and the even share of a window still growing in another QP's slow start put 1.6 BDPs
    // in flight at once and overflowed the one-BDP queue.
    if (psns_ >= ssthresh_ && f.even > psns_) {
      psns_ = f.even;
      acked_ = 0;
    }
    flight_cap_ = f.cap;
  }
  /// Whether an ACK train has measured the path (the requester paces from then on, so that
  /// the raises leave at about the path's rate: requester.cpp window_paces).
  bool train_measured() const { return train_rate_ > 0; }
  /// The path's rate as the first measured ACK train showed it (later ones may lower it),
  /// PSNs per ns (0: none yet).
  double train_rate() const { return train_rate_; }
  /// Slow-start threshold, PSNs.
  uint32_t threshold() const { return ssthresh_; }
  /// Smallest round trip measured, ns (0: none yet).
  uint64_t min_rtt_ns() const { return min_rtt_ns_; }
  /// Marks the path as host-local (Transport::host_local_path: the peer is a softrdma device
  /// of this host and no emulated link lies between): its round trip is scheduling and
  /// queueing in this host's rings, never propagation, so long_path() stays false however
  /// long it measures. Without this, two QPs feeding one same-host ring on a loaded machine
  /// measured a smallest RTT over 1 ms, the ACK trains took that queue for a path, and
  /// slow start ended at 1.5 such "BDPs": kv-bench 1 MiB WRITE fell from 4.5 to 4.0 GB/s.
  void set_host_local(bool on) { host_local_ = on; }
  /// Shares the ACK-train jump with the other QPs of this device towards the same peer
  /// (`share`: Transport::path_share, outliving this window; nullptr: none), whose packets
  /// carry `mtu` bytes: the jump takes only what their jumps left of the rate it measured,
  /// or a fair share (PathShare::take).
  void set_path_share(PathShare* share, uint32_t mtu) {
    share_ = share;
    share_mtu_ = mtu;
  }
  /// Whether the long-path rules apply (the ACK-train jump, slow start's exit at 1.5 BDPs,
  /// random-loss discrimination, free growth in congestion avoidance): the smallest RTT
  /// is at least kTrainMinRttNs and the path is not host-local.
  bool long_path() const { return !host_local_ && min_rtt_ns_ >= kTrainMinRttNs; }
  /// The path's bandwidth-delay product, PSNs: the largest recent delivery rate × the
  /// smallest round trip (0 until both are measured).
  uint32_t bdp_psns() const {
    return static_cast<uint32_t>(std::min<double>(kMaxPsns, delivery_rate() * double(min_rtt_ns_)));
  }
  /// The bandwidth-delay product of the path as all QPs sharing its window carry it
  /// (share_flight; their latest delivery rates summed × the smallest round trip, at least
  /// bdp_psns()), PSNs; bdp_psns() where this QP is alone on it. The latest samples, not each
  /// QP's largest: those are of different times, and summed they read 157 Gbit/s of a
  /// 100 Gbit/s path (the floor then kept 2 BDPs in flight and the queue overflowed). Each
  /// QP of several carries only its part of the path, so
  /// its own BDP would floor the shared window at a fraction of the path's: kv's 2 QPs on
  /// 100 Gbit/s × 50 ms, one random loss during a queue of 15 ms, halved 197,000 PSNs to
  /// 125,000 (0.8 BDP, 1.5 of the QP's own half) and the link ran part-empty for 8 round
  /// trips.
  uint32_t path_bdp_psns() const {
    if (!sharing_ || !share_) return bdp_psns();
    return std::max(bdp_psns(), static_cast<uint32_t>(std::min<double>(
                                    kMaxPsns, share_->path_rate() * double(min_rtt_ns_))));
  }
  /// Smoothed round trip, ns (RFC 6298 2.3: SRTT ← 7/8·SRTT + 1/8·sample; 0: none yet).
  uint64_t srtt_ns() const { return srtt_ns_; }
  /// The latest round-trip sample, ns (0 before the first): what queue_building() reads.
  uint64_t last_rtt_ns() const { return last_rtt_ns_; }
  /// PSNs reported lost within the current smallest-RTT round (on_sequence_nak's burst
  /// count), as of the last loss.
  uint64_t lost_in_round() const { return lost_in_round_; }
  /// The largest recent delivery rate, PSNs per ns (0 until measured).
  double delivery_rate() const {
    double best = 0;
    for (double r : rates_) best = std::max(best, r);
    return best;
  }
  /// The latest delivery-rate sample, PSNs per ns (0 until measured): what the QP carries
  /// now, where delivery_rate() is the most it carried recently.
  double latest_rate() const { return rates_[(next_rate_ + kRateSamples - 1) % kRateSamples]; }
  /// A round trip measured on a PSN sent once (Karn's rule: never on a resent one), ns.
  void on_rtt_sample(uint64_t rtt_ns) {
    if (rtt_ns && (!min_rtt_ns_ || rtt_ns < min_rtt_ns_)) min_rtt_ns_ = rtt_ns;
    if (rtt_ns) srtt_ns_ = srtt_ns_ ? (7 * srtt_ns_ + rtt_ns) / 8 : rtt_ns;
    if (rtt_ns) last_rtt_ns_ = rtt_ns;
  }
  /// Whether the path shows a standing queue: on a long path (long_path()), the latest
  /// round trip exceeds the smallest by more than min_rtt / kQueueDelayFraction. A loss
  /// without one is taken for random loss, not congestion (on_sequence_nak). Short and
  /// host-local paths always answer true (their losses are overflows: a same-host ring, a
  /// socket buffer).
  bool queue_building() const {
    if (!long_path() || !last_rtt_ns_) return true;
    return last_rtt_ns_ > min_rtt_ns_ + min_rtt_ns_ / kQueueDelayFraction;
  }
  /// A congestion signal that is not a loss (a RoCEv2 CNP): leave slow start, keep the
  /// window (the DCQCN pacer does the slowing down).
  void on_congestion_notified() {
    train_done_ = true;
    ssthresh_ = std::max<uint32_t>(2, std::min(ssthresh_, psns_));
  }
  /// A pause longer than this, ns, separates two flights (a sender's that ran dry, or a
  /// train's ACKs: note_train); 0 until the smallest RTT is measured: an eighth of the
  /// smallest RTT, at least kTrainMinNs.
  uint64_t idle_gap_ns() const {
    return min_rtt_ns_ ? std::max<uint64_t>(min_rtt_ns_ / kIdleGapDivisor, kTrainMinNs) : 0;
  }
  /// `n` PSNs newly acknowledged at `now_ns` (after its RTT sample, before on_acked): the
  /// delivery rate sample, and the slow-start round's ACK train (see the class comment).
  /// `train_origin` false: the ACK covers only PSNs sent before the sender last ran out of
  /// work and paused for longer than idle_gap_ns() (the requester tells, RequesterState::
  /// flight_psn), so it may not start a train — the flight behind it left after the pause,
  /// and its train timed from this ACK would spread over the pause and show the idle
  /// sender's rate (kv's zero-length path probe, ACKed 26 ms before a 128-PSN flight on a
  /// 50 ms path, made a 10 Gbit/s train read 80 Mbit/s: slow start ended at 196 PSNs and
  /// the first KV hand-off took 1.8 s instead of 0.4 s).
  void on_delivered(uint32_t n, uint64_t now_ns, bool train_origin = true) {
    note_train(n, now_ns, train_origin);
    if (!interval_start_ns_) interval_start_ns_ = now_ns;
    delivered_ += n;
    const uint64_t elapsed = now_ns - interval_start_ns_;
    if (!min_rtt_ns_ || elapsed < std::max<uint64_t>(min_rtt_ns_, 100'000)) return;
    rates_[next_rate_++ % kRateSamples] = double(delivered_) / double(elapsed);
    delivered_ = 0;
    interval_start_ns_ = now_ns;
  }
  /// Turns on window validation (the requester does, RequesterState; off by default so a
  /// bare window grows on every ACK): on a long path (long_path()) the window grows only
  /// while it limits the sender — note_limited() was called within the current or the
  /// previous window's worth of acknowledged PSNs. RFC 7661's congestion window validation
  /// (Linux: tcp_is_cwnd_limited). Without it, a QP whose send queue held it below its
  /// window (kv's 16,312 slices of 32 KiB: 130,000 PSNs of span, 65,000–110,000 in flight
  /// behind 0.1 % loss's holes) grew the window by 12.5 % per round trip of free growth to
  /// 354,000 PSNs, 2.3 BDPs of 100 Gbit/s × 50 ms, that nothing had tested: a deeper send
  /// queue or more QPs then sent all of it into the one-BDP queue at once.
  void set_validation(bool on) { validate_ = on; }
  /// The sender had work the window did not let out (requester.cpp window_room ≤ 0).
  void note_limited() { limited_ = true; }
  /// `n` PSNs newly acknowledged (ACK, read response, atomic ACK): grow (see set_validation).
  void on_acked(uint32_t n) {
    if (validate_ && long_path()) {
      const bool grows = limited_ || was_limited_;
      validation_acked_ += n;
      if (validation_acked_ >= psns_) {
        validation_acked_ = 0;
        was_limited_ = limited_;
        limited_ = false;
      }
      if (!grows) return;
    }
    if (psns_ < ssthresh_) {
      psns_ = std::min({kMaxPsns, ssthresh_, psns_ + n});
      // Slow start ends at 1.5 BDPs as the latest ACK train measured them (HyStart's exit
      // at the train's estimate, Ha & Rhee 2011; one BDP fills the path, half of one more
      // covers the estimate's error and the ACK clock's slack): beyond, the growth only
      // fills the bottleneck's queue, and where a random loss is not taken for congestion
      // (on_sequence_nak), nothing else would end it before the queue overflows.
      if (train_rate_ > 0 && psns_ >= 1.5 * train_rate_ * double(min_rtt_ns_)) ssthresh_ = psns_;
      return;
    }
    // Congestion avoidance: +1 per window of acknowledged PSNs (RFC 5681) — or, on a long
    // path whose round trip shows no queue, +1/kFreeGrowthDivisor of the window per window
    // (12.5 % per round trip): +1 PSN per round trip refills 7,000 PSNs of a 15,000-PSN
    // BDP in 6 minutes at 50 ms, and a slow-start exit that a slower sender (a loaded host)
    // made early would never be undone. Compound TCP's delay-based window does the same
    // (Tan et al., INFOCOM 2006: it grows fast while the queueing delay is low).
    acked_ += n;
    if (acked_ >= psns_) {
      acked_ -= psns_;
      const uint32_t step =
          queue_building() ? 1 : std::max<uint32_t>(1, psns_ / kFreeGrowthDivisor);
      psns_ = std::min(kMaxPsns, psns_ + step);
    }
  }
  /// A loss the responder reported: `lost` PSNs missing (a selective NAK's range; 1 for a
  /// sequence NAK) at `now_ns`. A random loss on a long link says nothing about congestion,
  /// and halving at each one caps AIMD at MSS/RTT · 1.22/√p (Mathis et al. 1997: 8 MB/s at
  /// 20 ms RTT, 0.1 % loss, whatever the link's rate). So:
  /// - on a long path whose round trip shows no standing queue (queue_building() false),
  ///   a loss is taken for random as long as the PSNs lost within one smallest RTT stay
  ///   within 1/kRandomLossFraction of the window: the window, the threshold and slow
  ///   start's ACK trains are kept (a delay-based discrimination of loss, as TCP Veno's,
  ///   Fu & Liew 2003; BBR ignores loss likewise, Cardwell et al. 2016). A queue that
  ///   overflows drops a burst — far more than that share — or shows in the round trip
  ///   first, so congestion losses still shrink the window;
  /// - otherwise halve, but not below 1.5 measured bandwidth-delay products of the path
  ///   (path_bdp_psns: of all the QPs sharing its window, PathShare): one fills the
  ///   path, and a bottleneck queue of one BDP keeps half of one free for resends (at two,
  ///   it stood full and dropped every burst of resends). In flight stays bounded by about
  ///   1.5 BDPs (IRN's BDP-FC bounds it by one, given the link rate;
  ///   here the rate is measured). Continues in congestion avoidance from there.
  /// Returns whether the loss counted as congestion (the caller then starts a recovery
  /// episode, within which further losses do not shrink the window again).
  bool on_sequence_nak(uint64_t now_ns = 0, uint32_t lost = 1) {
    if (!queue_building()) {
      if (!loss_round_ns_ || now_ns - loss_round_ns_ >= min_rtt_ns_) {
        loss_round_ns_ = now_ns;
        lost_in_round_ = 0;
      }
      lost_in_round_ += lost;
      if (lost_in_round_ <= std::max<uint64_t>(2, psns_ / kRandomLossFraction)) return false;
    }
    train_done_ = true;
    const uint32_t bdp = path_bdp_psns();
    const uint32_t floor = bdp + bdp / 2;
    const uint32_t next = psns_ > floor ? std::max(psns_ / 2, floor) : psns_;
    ssthresh_ = std::max<uint32_t>(2, next);
    psns_ = std::max<uint32_t>(1, next);
    acked_ = 0;
    return true;
  }
  /// A request was dropped locally: the same-host ring towards the peer was full with
  /// `in_flight` PSNs outstanding (the ring, not the path, is the bottleneck: no BDP floor).
  /// The window becomes half of what was in flight (at most half the window), and congestion
  /// avoidance continues from there, as TCP does on a local device-queue drop.
  void on_local_drop(uint32_t in_flight) {
    train_done_ = true;
    const uint32_t next = std::max<uint32_t>(1, std::min(psns_, in_flight) / 2);
    ssthresh_ = std::max<uint32_t>(2, next);
    psns_ = next;
    acked_ = 0;
  }
  /// The retransmit timer fired (nothing came back): start again from one PSN, slow start
  /// up to half the window that timed out.
  void on_timeout() {
    train_done_ = true;
    ssthresh_ = std::max<uint32_t>(2, psns_ / 2);
    psns_ = 1;
    acked_ = 0;
  }

 private:
  // The ACK train of a slow-start round: an ACK that comes a smallest RTT or more after the
  // current train began starts the next (what it and the ACKs of the following RTT cover
  // was sent before it came back: the round's flight). The first window-limited flight
  // leaves as a burst, so its train shows the bottleneck's rate; later rounds' trains,
  // clocked by ACKs, show about the doubled window that slow start gives anyway. A loss, a
  // CNP or the end of slow start ends the trains for good.
  void note_train(uint32_t n, uint64_t now_ns, bool origin_ok) {
    if (train_done_) return;
    if (psns_ >= ssthresh_) {
      train_done_ = true;
      return;
    }
    if (!train_start_ns_ || !min_rtt_ns_ || now_ns - train_start_ns_ >= min_rtt_ns_) {
      if (!origin_ok) return;    // the next ACK, of the flight itself, starts the train
      train_start_ns_ = now_ns;  // what this ACK covers was sent before the train's clock
      train_last_ns_ = now_ns;
      train_psns_ = 0;
      train_acks_ = 0;
      train_closed_ = false;
      if (train_rate_ > 0 && !first_train_over_) {
        // The first measured train is over, its estimate spread over the whole flight:
        // jump to one BDP of it (paced at kTrainPacingGain × its rate, so the raise leaves
        // at about the path's rate, not as a burst). The next train validates it (below).
        first_train_over_ = true;
        // Other QPs towards the peer may have jumped on the same link already (PathShare).
        double rate = train_rate_;
        if (share_ && share_mtu_)
          rate = share_->take(rate * share_mtu_, now_ns, 2 * min_rtt_ns_) / share_mtu_;
        const double bdp = rate * double(min_rtt_ns_);
        psns_ = std::max(
            psns_, static_cast<uint32_t>(std::min<double>(std::min(ssthresh_, kMaxPsns), bdp)));
      }
      train_base_ = psns_;
      return;
    }
    if (train_closed_) return;
    const uint64_t spread = now_ns - train_start_ns_;
    // The flight's ACKs came back together; one after a pause of more than idle_gap_ns() and
    // kTrainPauseSpacings times the train's mean spacing is for PSNs sent after a pause of
    // the sender's own (kv: 2 PSNs the path probe's ACK let out 24 ms after a 128-PSN
    // flight, whose ACKs took 0.5 ms — counted, the train read 4.4 PSNs/ms on a 305 PSNs/ms
    // path). The train ends with what it measured.
    const uint64_t pause = now_ns - train_last_ns_;
    if (train_acks_ && pause > idle_gap_ns() &&
        pause > kTrainPauseSpacings * (spread - pause) / train_acks_) {
      train_closed_ = true;
      return;
    }
    train_last_ns_ = now_ns;
    ++train_acks_;
    train_psns_ += n;
    if (!long_path() || train_psns_ < kTrainMinPsns || spread < kTrainMinNs) return;
    double rate = double(train_psns_) / double(spread);
    // Only the first measured train's flight left as a burst into an idle path; from then on
    // the requester paces at kTrainPacingGain × its rate, so a later train shows that pacer
    // at most — or more, when the ACKs were bunched on the way back (a busy receiver, a
    // late emulator: on 2 loaded CPUs a second round's train showed 150× the link's rate
    // over 21 µs and still 2.5× over 2.9 ms, and its raise overflowed the queue). Later
    // trains may lower the estimate (a slower sender), never raise it.
    if (first_train_over_) {
      rate = std::min(rate, train_rate_);
      // The jump's validation: a later train judges only once it spread over a quarter of
      // a BDP of what it shows (kTrainMinPsns alone is 0.1 % of a 100 Gbit/s × 50 ms
      // flight, whose first ACKs may be bunched or still paced); if it shows less than the
      // first train's rate it lowers the estimate, and a window above 1.5 BDPs of it — a
      // jump the first train overestimated (ACK compression) — is taken back there and
      // slow start ends, before the standing queue overflows.
      const double showed = rate * double(min_rtt_ns_);
      if (double(train_psns_) < showed / 4) return;
      if (rate < train_rate_ && psns_ > 1.5 * showed) {
        psns_ = std::max<uint32_t>(2, static_cast<uint32_t>(1.5 * showed));
        ssthresh_ = psns_;
        train_rate_ = rate;
        train_done_ = true;
        return;
      }
    }
    const double bdp = rate * double(min_rtt_ns_);
    const uint64_t cap =
        std::min<uint64_t>({ssthresh_, kMaxPsns, kTrainGain * uint64_t{train_base_}});
    const uint32_t to = static_cast<uint32_t>(std::min<double>(double(cap), bdp));
    psns_ = std::max(psns_, to);
    train_rate_ = rate;  // the longest-spread estimate so far
  }

  uint32_t psns_ = kInitialPsns;
  uint32_t ssthresh_ = kMaxPsns;
  uint32_t acked_ = 0;  // PSNs acknowledged since the last additive increase
  uint64_t min_rtt_ns_ = 0;
  uint64_t srtt_ns_ = 0;
  uint64_t last_rtt_ns_ = 0;         // the latest round-trip sample, ns
  uint64_t loss_round_ns_ = 0;       // when the current loss-counting round began, ns
  uint64_t lost_in_round_ = 0;       // PSNs reported lost in it (losses taken for random)
  uint64_t interval_start_ns_ = 0;   // current delivery-rate interval
  uint64_t delivered_ = 0;           // PSNs acknowledged in it
  double rates_[kRateSamples] = {};  // PSNs per ns, recent intervals
  size_t next_rate_ = 0;
  uint64_t train_start_ns_ = 0;    // the current ACK train's first ACK, ns (0: none yet)
  uint64_t train_psns_ = 0;        // PSNs acknowledged after it in the train
  uint64_t train_last_ns_ = 0;     // the train's latest ACK, ns
  uint32_t train_acks_ = 0;        // ACKs counted in the train after its first
  bool train_closed_ = false;      // a pause in the ACKs ended the train (note_train)
  double train_rate_ = 0;          // the path's rate as the trains measured it, PSNs/ns
  bool first_train_over_ = false;  // the first measured train has ended
  uint32_t train_base_ = 0;        // the window when the train began, PSNs
  bool train_done_ = false;
  bool host_local_ = false;         // set_host_local()
  bool validate_ = false;           // set_validation()
  bool limited_ = false;            // note_limited() since the current validation round began
  bool was_limited_ = false;        // … within the round before
  uint32_t validation_acked_ = 0;   // PSNs acknowledged in the current validation round
  PathShare* share_ = nullptr;      // set_path_share()
  uint32_t flight_cap_ = kMaxPsns;  // share_flight()'s answer, PSNs
  bool sharing_ = false;            // share_flight() found other QPs on the path
  uint32_t share_mtu_ = 0;          // bytes per PSN, for share_'s bytes per ns
};

}  // namespace softrdma::engine
