// Link emulation on the transmit path, in the spirit of Linux netem: drops packets so the
// transport's loss recovery can be exercised and studied without a real lossy link.
// Configured by SOFTRDMA_NETEM, e.g. "loss=5%,every=13,seed=42".
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace softrdma::net {

/// Parsed SOFTRDMA_NETEM settings.
struct NetemConfig {
  double loss = 0.0;      ///< probability in [0, 1] that a packet is dropped at random
  uint64_t every = 0;     ///< drop every Nth packet (0: off)
  uint64_t seed = 1;      ///< PRNG seed for `loss`
  bool enabled() const { return loss > 0.0 || every > 0; }
};

/// Parses "key=value" pairs separated by commas: loss=P% (or a fraction 0..1), every=N,
/// seed=S. Returns false and sets `error` on an unknown key or a bad value.
bool parse_netem(const std::string& spec, NetemConfig& out, std::string& error);

/// Decides, packet by packet, whether the emulated link drops it.
class Netem {
 public:
  explicit Netem(const NetemConfig& c) : cfg_(c), rng_(c.seed) {}
  /// True if the next packet is to be dropped.
  bool drop() {
    ++count_;
    if (cfg_.every && count_ % cfg_.every == 0) return true;
    if (cfg_.loss > 0.0 && uniform_(rng_) < cfg_.loss) return true;
    return false;
  }
  const NetemConfig& config() const { return cfg_; }

 private:
  NetemConfig cfg_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  uint64_t count_ = 0;
};

}  // namespace softrdma::net
