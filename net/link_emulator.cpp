// Link emulation decisions; see link_emulator.h for the model.
#include "net/link_emulator.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace softrdma::net {

bool LocalLinkClock::reserve(uint64_t now_ns, uint64_t tx_ns, uint64_t max_backlog_ns,
                             uint64_t& backlog_ns, uint64_t& done_ns) {
  const uint64_t start = std::max(now_ns, free_ns_);
  if (start - now_ns > max_backlog_ns) return false;
  backlog_ns = start - now_ns;
  free_ns_ = done_ns = start + tx_ns;
  return true;
}

bool SharedLinkClock::reserve(uint64_t now_ns, uint64_t tx_ns, uint64_t max_backlog_ns,
                              uint64_t& backlog_ns, uint64_t& done_ns) {
  uint64_t cur = free_ns_->load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t start = std::max(now_ns, cur);
    if (start - now_ns > max_backlog_ns) return false;
    const uint64_t done = start + tx_ns;
    if (free_ns_->compare_exchange_weak(cur, done, std::memory_order_relaxed)) {
      backlog_ns = start - now_ns;
      done_ns = done;
      return true;
    }
  }
}

LinkEmulator::LinkEmulator(const LinkParams& params, LinkClock* clock)
    : p_(params), clock_(clock ? clock : &own_clock_), rng_(params.seed) {}

int64_t LinkEmulator::jitter() {
  if (!p_.jitter_ns) return 0;
  const double j = static_cast<double>(p_.jitter_ns);
  if (p_.jitter_dist == JitterDist::kUniform) return std::llround((2 * uniform() - 1) * j);
  return std::llround(std::clamp(normal_(rng_), -3.0, 3.0) * j);
}

LinkDecision LinkEmulator::submit(uint64_t now_ns, size_t bytes) {
  LinkDecision d;
  ++c_.submitted;
  if (p_.loss > 0 && uniform() < p_.loss) {
    ++c_.dropped_loss;
    d.verdict = LinkVerdict::kDropLoss;
    return d;
  }
  if (p_.burst.enabled()) {
    // The state moves once per packet, then the packet meets the new state's loss.
    if (bad_state_ ? uniform() < p_.burst.r : uniform() < p_.burst.p) bad_state_ = !bad_state_;
    if (uniform() < (bad_state_ ? p_.burst.loss_bad : p_.burst.loss_good)) {
      ++c_.dropped_burst;
      d.verdict = LinkVerdict::kDropBurst;
      return d;
    }
  }
  uint64_t t = now_ns;
  if (p_.rate_bps) {
    const auto bits_ns = [this](uint64_t b) {  // time to serialise b bytes, ns
      return static_cast<uint64_t>(
          std::ceil(static_cast<double>(b) * 8e9 / static_cast<double>(p_.rate_bps)));
    };
    // The queue may hold queue_limit bytes ahead of this packet.
    uint64_t backlog = 0, done = 0;
    if (!clock_->reserve(now_ns, bits_ns(bytes), bits_ns(p_.queue_limit()), backlog, done)) {
      ++c_.dropped_queue;
      d.verdict = LinkVerdict::kDropQueue;
      return d;
    }
    if (backlog) ++c_.queued;
    if (p_.ecn_bytes && backlog >= bits_ns(p_.ecn_bytes)) {
      d.ecn_ce = true;
      ++c_.ecn_marked;
    }
    t = done;
  }
  if (p_.reorder > 0 && uniform() < p_.reorder) {
    ++c_.reordered;  // overtakes what is in flight; later packets are not held behind it
    d.reordered = true;
  } else if (p_.delay_ns || p_.jitter_ns) {
    const int64_t j = jitter();
    const int64_t delay = std::max<int64_t>(0, static_cast<int64_t>(p_.delay_ns) + j);
    t = std::max(t + static_cast<uint64_t>(delay), last_depart_ns_);
    last_depart_ns_ = t;
  }
  if (p_.duplicate > 0 && uniform() < p_.duplicate) {
    d.copies = 2;
    ++c_.duplicated;
  }
  if (p_.corrupt > 0 && bytes > 0 && uniform() < p_.corrupt) {
    d.corrupt_bit = static_cast<int64_t>(uniform() * static_cast<double>(bytes * 8));
    const auto bits = static_cast<int64_t>(bytes * 8);
    if (d.corrupt_bit >= bits) d.corrupt_bit = bits - 1;
    ++c_.corrupted;
  }
  if (t > now_ns) ++c_.delayed;
  ++c_.sent;
  d.depart_ns = t;
  return d;
}

}  // namespace softrdma::net
