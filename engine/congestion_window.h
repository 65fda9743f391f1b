// The requester's congestion window: how many PSNs may be in flight, AIMD as TCP's.
// Owned by the requester (RequesterState); the completer reports what the ACKs said.
// A type of its own, as UCX keeps its RC flow-control window (uct_rc_fc_t), so every
// change of the window is one of the named events below.
#pragma once

#include <algorithm>
#include <cstdint>

namespace softrdma::engine {

/// PSNs in flight, 1 … kMaxPsns: halved by a sequence NAK, 1 after a retransmit timeout,
/// grown by every newly acknowledged PSN. Besides pacing, a window that changes between
/// go-back-N rounds cannot keep losing the same packet under periodic loss, which a fixed
/// window did (the round length was a multiple of the loss period).
class CongestionWindow {
 public:
  /// The largest window, and the initial one: the requester's PSN window (rxe: 128).
  static constexpr uint32_t kMaxPsns = 128;

  /// PSNs that may be outstanding now.
  uint32_t psns() const { return psns_; }
  /// `n` PSNs newly acknowledged (ACK, read response, atomic ACK): grow by n.
  void on_acked(uint32_t n) { psns_ = std::min(kMaxPsns, psns_ + n); }
  /// A PSN sequence NAK (a loss the responder saw): halve.
  void on_sequence_nak() { psns_ = std::max<uint32_t>(1, psns_ / 2); }
  /// The retransmit timer fired (nothing came back): start again from one PSN.
  void on_timeout() { psns_ = 1; }

 private:
  uint32_t psns_ = kMaxPsns;
};

}  // namespace softrdma::engine
