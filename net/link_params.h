// One direction of an emulated link as a user states it (SOFTRDMA_WAN, `softrdma run --wan`,
// topology files): the parameters and their text form. Split from the emulator so that what
// only reads a link's description (the verbs port's rate, the sysfs tree every `softrdma run`
// process preloads) does not carry the emulator, its clocks or libpcap.
#pragma once

#include <cstdint>
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

}  // namespace softrdma::net
