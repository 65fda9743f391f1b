// The requester's loss-recovery state: one named state per QP instead of what four deadlines
// and several sentinel fields implied (rxe_comp.c names its completer states the same way).
#pragma once

#include <cstdint>

namespace softrdma::engine {

/// Where a reliable QP's requester stands in loss recovery (RequesterState::recovery).
/// Transitions (requester::enter_recovery; each logged at debug with its cause):
/// - kNone → kGoBackN: a sequence NAK, a retransmit timeout, a response out of order, a
///   partial ACK of a resend-again, a request dropped on a full same-host ring (IBTA vol 1
///   9.7.5.2.2; the requester rewinds to the missing PSN and sends everything again);
/// - kNone → kSelective: a selective NAK (the named PSNs are resent, nothing else; IRN,
///   Mittal et al. 2018); kSelective → kGoBackN when a go-back-N cause comes on top;
/// - any → kRnrWait: an RNR NAK (IBTA 9.7.5.2.8); kRnrWait → kGoBackN when the RNR timer
///   expires (the requester resends from the NAKed PSN);
/// - kNone → kProbe: the tail-loss probe sent a PSN again (RACK-TLP, RFC 8985 7): the last,
///   or the oldest to a go-back-N responder; kProbe → kGoBackN when the ACK answering that
///   oldest PSN stops short of what was sent before it;
/// - any but kRnrWait → kNone: ACK progress covered everything sent before the recovery
///   began (RequesterState::recovery_end), or, for kProbe, any ACK progress.
enum class Recovery : uint8_t { kNone, kGoBackN, kSelective, kRnrWait, kProbe };

/// The state's name as logs print it ("none", "go-back-N", "selective", "RNR wait", "probe").
constexpr const char* recovery_name(Recovery r) {
  switch (r) {
    case Recovery::kNone:
      return "none";
    case Recovery::kGoBackN:
      return "go-back-N";
    case Recovery::kSelective:
      return "selective";
    case Recovery::kRnrWait:
      return "RNR wait";
    case Recovery::kProbe:
      return "probe";
  }
  return "?";
}

}  // namespace softrdma::engine
