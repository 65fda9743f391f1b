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

#include "net/link_params.h"

namespace softrdma::net {

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
