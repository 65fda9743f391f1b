// DCQCN's reaction point: the per-QP sending rate a requester paces its packets at, cut by
// RoCEv2 CNPs and recovered by a timer and a byte counter. Zhu et al., "Congestion Control
// for Large-Scale RDMA Deployments", SIGCOMM 2015, section 3.1 (the RP algorithm, fig. 7);
// parameter names as mlx5's /sys/class/net/<if>/ecn/roce_rp/ knobs where one exists.
//
// Time is whatever the caller passes (ns, the device's monotonic clock): the machine has no
// timer of its own. Its periodic events (α decay every K, rate increase every T) are applied
// lazily, as many as have elapsed, whenever it is asked something — so a fake clock drives it
// in the unit tests, and an idle QP costs nothing.
#pragma once

#include <algorithm>
#include <cstdint>

namespace softrdma::engine {

/// DCQCN reaction-point parameters. Rates are bytes per ns (1 Gbit/s = 0.125 B/ns).
struct DcqcnParams {
  /// The rate a QP starts at and never exceeds, B/ns: the sender's line rate. 0: unpaced
  /// until the first CNP, which then starts from the rate measured over the last round trip
  /// (what mlx5's rate_to_set_on_first_cnp = 0 means: the current rate).
  double line_rate = 0;
  /// α's gain g (paper 3.1: g = 1/256; mlx5 dce_tcp_g).
  double g = 1.0 / 256;
  /// α update period K, ns (paper: 55 µs; mlx5 dce_tcp_rtt).
  uint64_t alpha_period_ns = 55'000;
  /// Rate-increase timer T, ns (paper: 55 µs with K; mlx5 rpg_time_reset, default 300 µs).
  uint64_t timer_ns = 300'000;
  /// Byte counter B, bytes (mlx5 rpg_byte_reset: 32767; the paper's 10 MB at 40 Gbit/s).
  uint64_t byte_reset = 32767;
  /// Fast-recovery steps F before additive increase (paper: 5; mlx5 rpg_threshold).
  uint32_t fast_recovery_steps = 5;
  /// Additive increase R_AI, B/ns (paper: 40 Mbit/s; mlx5 rpg_ai_rate: 5 Mbit/s).
  double ai_rate = 40e6 / 8 / 1e9;
  /// Hyper increase R_HAI, B/ns (mlx5 rpg_hai_rate: 50 Mbit/s; the paper uses 10 × R_AI).
  double hai_rate = 400e6 / 8 / 1e9;
  /// The lowest rate, B/ns (mlx5 rpg_min_rate: 1 Mbit/s).
  double min_rate = 1e6 / 8 / 1e9;
  /// Smallest factor one CNP may cut the rate by (mlx5 rpg_min_dec_fac: 50 %).
  double min_dec_factor = 0.5;
  /// Rate cuts happen at most this often, ns (mlx5 rate_reduce_monitor_period, 4 µs). The
  /// machine also waits one smallest measured round trip between cuts (set_min_rtt): on a
  /// long link the CNPs of one congestion episode keep arriving for a round trip after the
  /// first cut, and cutting at each of them (every min_time_between_cnps) would take the
  /// rate to the floor — the "at most once per window" rule of ECN-capable TCP (RFC 3168,
  /// 6.1.2). With microsecond data-centre RTTs this is the paper's behaviour.
  uint64_t reduce_period_ns = 4'000;
};

/// One QP's DCQCN reaction point: current rate Rc, target rate Rt, α, the stage counters
/// of the timer and the byte counter (paper fig. 7). Idle at the line rate until the first
/// CNP; from then on α decays and the rate recovers on the timer and the byte counter.
class DcqcnRate {
 public:
  DcqcnRate() : DcqcnRate(DcqcnParams{}) {}
  explicit DcqcnRate(const DcqcnParams& p) : p_(p), rc_(p.line_rate), rt_(p.line_rate) {}

  /// Current rate Rc, B/ns; 0 while unpaced (no line rate, no CNP yet).
  double rate() const { return rc_; }
  /// Target rate Rt, B/ns.
  double target() const { return rt_; }
  /// α, 0…1.
  double alpha() const { return alpha_; }
  /// CNPs that cut the rate (the others arrived within a reduce period).
  uint64_t cuts() const { return cuts_; }
  const DcqcnParams& params() const { return p_; }

  /// The smallest round trip measured, ns: the least time between two rate cuts, and the
  /// least rate-increase period (the timer T, and the byte counter B as bytes sent in one
  /// round trip at the current rate). The paper's T = 55 µs and B assume microsecond round
  /// trips; on a 20 ms link they would raise the rate to the line rate hundreds of times
  /// before one CNP could say it is too high, and the queue would overflow every round
  /// trip (measured: more tail drops than without congestion control). DCQCN's feedback
  /// loop is only stable when its increase steps are slower than the feedback delay (Zhu
  /// et al., "ECN or Delay", CoNEXT 2016, section 4) — one increase step per round trip,
  /// as AIMD in TCP.
  void set_min_rtt(uint64_t rtt_ns) { min_rtt_ns_ = rtt_ns; }

  /// A CNP for this QP at `now_ns`; `measured_rate` (B/ns) is what the QP delivered
  /// recently, the starting point when it was unpaced. Rt ← Rc, Rc ← Rc·(1 − α/2)
  /// (at most by min_dec_factor), α ← (1 − g)·α + g; the timer and byte counter restart.
  void on_cnp(uint64_t now_ns, double measured_rate) {
    if (!active_) {
      // The reaction point starts at the first CNP, α at 1 (mlx5 allocates a QP's rate
      // limiter then, with initial_alpha_value 1023/1023).
      active_ = true;
      alpha_updated_ns_ = timer_start_ns_ = now_ns;
    }
    advance(now_ns);
    if (rc_ == 0) {
      rc_ = rt_ = measured_rate > 0 ? measured_rate : p_.min_rate;
      last_cut_ns_ = 0;
    }
    // The rate falls once per reduce period by the α the CNPs so far measured; α rises on
    // every CNP (it measures how often they come) — the paper's order: cut, then update α.
    const uint64_t gap = std::max(p_.reduce_period_ns, min_rtt_ns_);
    const bool cut = !cuts_ || now_ns - last_cut_ns_ >= gap;
    const double alpha = alpha_;
    alpha_ = (1 - p_.g) * alpha_ + p_.g;
    alpha_updated_ns_ = now_ns;
    if (!cut) return;
    rt_ = rc_;
    rc_ = std::max({p_.min_rate, rc_ * std::max(1 - alpha / 2, p_.min_dec_factor)});
    last_cut_ns_ = now_ns;
    ++cuts_;
    timer_count_ = byte_count_ = 0;
    bytes_ = 0;
    timer_start_ns_ = now_ns;
  }

  /// `bytes` sent at `now_ns`: the byte counter's stage advances every byte_reset bytes.
  void on_sent(uint64_t bytes, uint64_t now_ns) {
    advance(now_ns);
    if (!active_) return;
    bytes_ += bytes;
    const uint64_t b = byte_period();
    while (bytes_ >= b) {
      bytes_ -= b;
      ++byte_count_;
      increase();
    }
  }

  /// Applies the α decays and timer increases due by `now_ns`.
  void advance(uint64_t now_ns) {
    if (!active_ || now_ns < alpha_updated_ns_) return;
    if (now_ns > alpha_updated_ns_ + p_.alpha_period_ns) {
      const uint64_t n = (now_ns - alpha_updated_ns_) / p_.alpha_period_ns;
      for (uint64_t i = 0; i < n && alpha_ > 1e-9; ++i) alpha_ *= 1 - p_.g;
      alpha_updated_ns_ += n * p_.alpha_period_ns;
    }
    // Bounded: an idle QP catches up at most kMaxTimerEvents increases at once.
    const uint64_t t = timer_period();
    for (int i = 0; now_ns >= timer_start_ns_ + t && !at_line_rate(); ++i) {
      if (i == kMaxTimerEvents) {
        timer_start_ns_ = now_ns;
        break;
      }
      timer_start_ns_ += t;
      ++timer_count_;
      increase();
    }
    if (at_line_rate()) timer_start_ns_ = std::max(timer_start_ns_, now_ns - t);
  }

 private:
  static constexpr int kMaxTimerEvents = 4096;
  uint64_t timer_period() const { return std::max(p_.timer_ns, min_rtt_ns_); }
  uint64_t byte_period() const {
    return std::max<uint64_t>(p_.byte_reset, uint64_t(rc_ * double(min_rtt_ns_)));
  }
  bool at_line_rate() const { return p_.line_rate > 0 && rc_ >= p_.line_rate; }

  // A rate-increase event (paper fig. 7), the counter already stepped: the first F events
  // of both are fast recovery, hyper increase once both passed F, additive in between.
  void increase() {
    const uint32_t f = p_.fast_recovery_steps;
    const uint64_t hi = std::max(timer_count_, byte_count_);
    const uint64_t lo = std::min(timer_count_, byte_count_);
    if (hi <= f) {
      // fast recovery: towards the rate before the cut
    } else if (lo > f) {
      rt_ += double(lo - f) * p_.hai_rate;
    } else {
      rt_ += p_.ai_rate;
    }
    if (p_.line_rate > 0) rt_ = std::min(rt_, p_.line_rate);
    rc_ = (rt_ + rc_) / 2;
  }

  DcqcnParams p_;
  double rc_ = 0, rt_ = 0;
  bool active_ = false;  // a CNP arrived: the timers and the byte counter run
  double alpha_ = 1;     // mlx5 initial_alpha_value 1023/1023
  uint64_t alpha_updated_ns_ = 0;
  uint64_t timer_start_ns_ = 0;
  uint64_t timer_count_ = 0, byte_count_ = 0;
  uint64_t bytes_ = 0;
  uint64_t last_cut_ns_ = 0;
  uint64_t cuts_ = 0;
  uint64_t min_rtt_ns_ = 0;
};

/// Paces packets at a DcqcnRate: a token bucket of at most `burst_bytes`, refilled at the
/// current rate. The requester asks may_send() before each packet and, when refused, arms
/// its QP's timer for next_send_ns() (the device's timer queue; nothing spins).
class Pacer {
 public:
  /// Largest burst, bytes: 64 KiB, one GSO batch's worth, so pacing keeps sends batched.
  static constexpr uint64_t kBurstBytes = 64 << 10;

  /// Whether a packet may leave at `now_ns` at `rate` (B/ns; 0: unpaced).
  bool may_send(double rate, uint64_t now_ns) {
    if (rate <= 0) return true;
    refill(rate, now_ns);
    return tokens_ > 0;
  }
  /// `bytes` left at `now_ns`.
  void on_sent(uint64_t bytes, double rate, uint64_t now_ns) {
    if (rate <= 0) return;
    refill(rate, now_ns);
    tokens_ -= double(bytes);
  }
  /// When the bucket holds a positive balance again at `rate`, ns.
  uint64_t next_send_ns(double rate) const {
    if (rate <= 0 || tokens_ > 0) return last_ns_;
    return last_ns_ + uint64_t(-tokens_ / rate) + 1;
  }

 private:
  void refill(double rate, uint64_t now_ns) {
    if (now_ns > last_ns_)
      tokens_ = std::min<double>(kBurstBytes, tokens_ + rate * double(now_ns - last_ns_));
    last_ns_ = std::max(last_ns_, now_ns);
  }
  double tokens_ = kBurstBytes;
  uint64_t last_ns_ = 0;
};

}  // namespace softrdma::engine
