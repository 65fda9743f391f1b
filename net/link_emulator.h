// Wide-area link emulation on the transmit path (what Linux netem + tbf do for a qdisc, in
// user space, so it runs where `tc qdisc … netem` does not): one-way delay, jitter, random
// and burst loss, reordering, duplication, corruption, a rate limit with a bounded FIFO that
// drops at the tail, and ECN marking above a queue threshold.
//
// The emulator only decides: for each packet handed to submit() it says whether the packet
// is dropped (and why), when it leaves the emulated link (ns on the caller's clock), how
// many copies go, whether it is CE-marked and which bit (if any) is flipped. The caller — the
// device's transmit path — holds the packet in a timed queue until then. Nothing here reads
// a clock or sleeps, so everything is testable on a fake clock.
//
// Model of one direction of a link, per packet of `bytes` submitted at `now`:
//   1. loss: random (Bernoulli `loss`), then burst loss (Gilbert–Elliott, below) — dropped
//      packets never occupy the queue, as with netem's loss ahead of its queue;
//   2. rate limit (rate_bps > 0): the link serialises packets one after another at rate_bps;
//      `link_free` is the time the link finishes what is queued. The backlog at `now` is
//      (link_free − now)·rate/8 bytes: above queue_bytes the packet is tail-dropped, above
//      ecn_bytes it is CE-marked (RED-like step marking, as DCQCN's switches use with
//      Kmin = Kmax); otherwise it leaves the queue at max(now, link_free) + bytes·8/rate;
//   3. propagation: + delay_ns + jitter, jitter drawn from the stated distribution and
//      clamped so that a packet never leaves before the one submitted ahead of it (no
//      reordering from jitter); with probability `reorder` a packet skips the delay instead
//      and overtakes the ones in flight (netem's reorder);
//   4. duplicate / corrupt with their probabilities (a corrupted packet has one random bit
//      flipped; the receiver's ICRC check drops it).
// Several processes that share one emulated bottleneck (ranks of one site behind one WAN
// link) pass the same LinkClock (e.g. ShmLinkClock in shared memory): its `link_free` time
// is the only state they must share.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

namespace softrdma::net {

/// Jitter distribution of LinkParams::jitter_ns.
enum class JitterDist : uint8_t {
  kNormal,   ///< normal, σ = jitter_ns, truncated at ±3σ (netem's default shape)
  kUniform,  ///< uniform in [−jitter_ns, +jitter_ns]
};

/// Gilbert–Elliott two-state burst loss (Gilbert 1960; Elliott 1963; netem's
/// "loss gemodel p r 1-h 1-k"): per packet the state moves good → bad with probability p and
/// bad → good with probability r; a packet is lost with probability loss_bad in the bad
/// state and loss_good in the good one. Mean burst length 1/r packets; stationary share of
/// bad packets p/(p + r).
struct GilbertElliott {
  double p = 0.0;          ///< P(good → bad) per packet, [0, 1]; 0 turns the model off
  double r = 1.0;          ///< P(bad → good) per packet, (0, 1]
  double loss_bad = 1.0;   ///< loss probability in the bad state, [0, 1]
  double loss_good = 0.0;  ///< loss probability in the good state, [0, 1]
  bool enabled() const { return p > 0.0; }
  /// Long-run loss fraction: (p·loss_bad + r·loss_good) / (p + r).
  double mean_loss() const;
};

/// One direction of an emulated link. Defaults: a perfect link.
struct LinkParams {
  uint64_t delay_ns = 0;   ///< one-way propagation delay, ns
  uint64_t jitter_ns = 0;  ///< jitter scale, ns (σ for kNormal, half-width for kUniform)
  JitterDist jitter_dist = JitterDist::kNormal;
  double loss = 0.0;         ///< random loss probability per packet, [0, 1]
  GilbertElliott burst;      ///< burst loss on top of `loss`
  double reorder = 0.0;      ///< probability a packet skips the delay, [0, 1]
  double duplicate = 0.0;    ///< probability a packet is sent twice, [0, 1]
  double corrupt = 0.0;      ///< probability a packet gets one bit flipped, [0, 1]
  uint64_t rate_bps = 0;     ///< link rate, bits/s (1 Gbit/s = 1e9); 0: unlimited
  uint64_t queue_bytes = 0;  ///< FIFO limit in bytes with a rate; 0: one bandwidth-delay
                             ///< product (rate × 2·delay), at least 64 KiB
  uint64_t ecn_bytes = 0;    ///< CE-mark above this backlog, bytes; 0: no marking
  uint64_t seed = 1;         ///< PRNG seed (runs are reproducible)

  /// True when any impairment is set.
  bool shaped() const;
  /// The FIFO limit in effect (queue_bytes, or its default), bytes; 0 without a rate.
  uint64_t queue_limit() const;
};

/// Parses "key=value" pairs separated by commas (or spaces) into `out`, over its current
/// values. Keys: delay, jitter (durations: 10ms, 250us, 1.5s, 100ns; a bare number is ms),
/// dist=normal|uniform, loss (P% or a fraction), burst=p:r[:loss_bad[:loss_good]]
/// (probabilities, % allowed), reorder, duplicate, corrupt (P% or fraction), rate (bits/s
/// with k/m/g suffix and optional "bit"/"bps": 1gbit, 10g, 500mbit; or bytes/s as "MB/s"),
/// queue, ecn (bytes with k/m/g suffix (powers of 1024), or "Nbdp" = N bandwidth-delay
/// products), seed. Returns false and sets `error` to a message naming the bad item.
bool parse_link_params(const std::string& spec, LinkParams& out, std::string& error);

/// Why a packet did not go, or that it went.
enum class LinkVerdict : uint8_t { kSend, kDropLoss, kDropBurst, kDropQueue };

/// What happens to one submitted packet.
struct LinkDecision {
  LinkVerdict verdict = LinkVerdict::kSend;
  uint64_t depart_ns = 0;    ///< when it leaves the link (kSend), caller's clock, ns
  uint32_t copies = 1;       ///< 2 when duplicated
  bool ecn_ce = false;       ///< mark the packet Congestion Experienced
  bool reordered = false;    ///< skipped the delay (overtakes packets in flight)
  int64_t corrupt_bit = -1;  ///< bit index in the packet to flip (< 8·bytes), or −1
};

/// Per-link totals since construction (packets).
struct LinkCounters {
  uint64_t submitted = 0;
  uint64_t sent = 0;           ///< verdict kSend
  uint64_t queued = 0;         ///< sent after waiting behind earlier packets (rate limit)
  uint64_t delayed = 0;        ///< sent with a non-zero departure delay
  uint64_t dropped_loss = 0;   ///< random loss
  uint64_t dropped_burst = 0;  ///< Gilbert–Elliott loss
  uint64_t dropped_queue = 0;  ///< tail drop at the FIFO limit
  uint64_t ecn_marked = 0;
  uint64_t duplicated = 0;
  uint64_t corrupted = 0;
  uint64_t reordered = 0;  ///< skipped the delay
};

/// The serialisation state of a rate-limited link: the time it becomes free. Shared by
/// every sender behind the same bottleneck.
class LinkClock {
 public:
  virtual ~LinkClock() = default;
  /// Atomically queues a packet needing `tx_ns` of link time, submitted at `now_ns`, unless
  /// the link is busy for more than `max_backlog_ns` beyond `now_ns` (then false, nothing
  /// changes). On success `backlog_ns` is the wait ahead of it and `done_ns` the time its
  /// last bit leaves.
  virtual bool reserve(uint64_t now_ns, uint64_t tx_ns, uint64_t max_backlog_ns,
                       uint64_t& backlog_ns, uint64_t& done_ns) = 0;
};

/// A LinkClock in this process (one sender, or senders sharing one emulator object).
class LocalLinkClock final : public LinkClock {
 public:
  bool reserve(uint64_t now_ns, uint64_t tx_ns, uint64_t max_backlog_ns, uint64_t& backlog_ns,
               uint64_t& done_ns) override;

 private:
  uint64_t free_ns_ = 0;
};

/// A LinkClock over a 64-bit word that other processes map too (e.g. in /dev/shm): the
/// reservation is a compare-and-swap loop, so any number of processes share the bottleneck.
/// The word must be 8-byte aligned, lock-free (std::atomic<uint64_t> is on x86-64 and
/// aarch64) and on the same clock in every process (base/clock.h: CLOCK_MONOTONIC / K).
class SharedLinkClock final : public LinkClock {
 public:
  explicit SharedLinkClock(std::atomic<uint64_t>* free_ns) : free_ns_(free_ns) {}
  bool reserve(uint64_t now_ns, uint64_t tx_ns, uint64_t max_backlog_ns, uint64_t& backlog_ns,
               uint64_t& done_ns) override;

 private:
  std::atomic<uint64_t>* free_ns_;
};

/// One direction of an emulated link (see the file comment). Not thread-safe: one caller
/// (a device's transmit path, under its lock).
class LinkEmulator {
 public:
  /// `clock`: the shared bottleneck, or null for a private one. It must outlive this.
  explicit LinkEmulator(const LinkParams& params, LinkClock* clock = nullptr);
  /// Decides the fate of a packet of `bytes` (the UDP payload: RoCEv2 headers and data)
  /// submitted at `now_ns`. now_ns must not go backwards between calls.
  LinkDecision submit(uint64_t now_ns, size_t bytes);
  const LinkParams& params() const { return p_; }
  const LinkCounters& counters() const { return c_; }

 private:
  double uniform() { return uni_(rng_); }
  int64_t jitter();

  LinkParams p_;
  LinkCounters c_;
  LocalLinkClock own_clock_;
  LinkClock* clock_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uni_{0.0, 1.0};
  std::normal_distribution<double> normal_{0.0, 1.0};
  bool bad_state_ = false;
  uint64_t last_depart_ns_ = 0;  // of the last packet that took the delay (FIFO order)
};

}  // namespace softrdma::net
