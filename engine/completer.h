// The completer transport unit (completer.cpp): ACK/NAK and responses to send CQEs; the
// retransmit, RNR, resend-check and tail-loss-probe timers (IBTA vol 1, 9.7.5.2; rxe_comp.c).
// Declared here, not in qp.h, so that qp_type.cpp can name the units without the QP's whole
// definition (one header per transport unit).
#pragma once

#include <cstdint>

#include "engine/transport.h"
#include "wire/roce.h"

namespace softrdma::engine {

class QueuePair;

/// Completer: processes ACK/NAK, read responses and atomic ACKs; runs the retransmit and
/// RNR timers.
namespace completer {
/// Handles one response packet addressed to this QP.
void on_response(QueuePair& qp, const wire::Packet& pkt, Transport& t);
/// Fires expired timers (retransmit, RNR back-off, pacing, lost resends).
void on_timer(QueuePair& qp, Transport& t, uint64_t now_ns);
/// A RoCEv2 CNP for this QP (the responder saw a CE-marked request of ours): the DCQCN
/// rate is cut (when this QP paces) and the window leaves slow start.
void on_cnp(QueuePair& qp, Transport& t);
/// Selective mode: the oldest unacknowledged PSN is sent again when nothing moved it for this
/// long since it became the oldest or was last resent, ns: 1.5 × the smoothed round trip
/// (at least 1 ms; 0 before any round trip is measured, when only the retransmit timer
/// recovers).
uint64_t resend_check_ns(const QueuePair& qp);
/// The tail-loss probe timeout, ns: 2 × the smoothed round trip but at most half the
/// retransmit timeout, at least 10 ms (Linux's TLP floor: a loaded host delays ACKs by
/// milliseconds without any loss, and a spurious probe is a duplicate packet), and only when
/// that is below the retransmit timeout; 0 (no probe)
/// before any round trip is measured or with the retransmit timer off. A message's last packets
/// lost (no later packet reveals the gap, so no NAK comes) then cost about one probe timeout plus a
/// round trip, not the retransmit timeout (537 ms at the CM's default ACK timeout of 17).
/// RACK-TLP's PTO (RFC 8985 7.2).
uint64_t probe_timeout_ns(const QueuePair& qp);
}  // namespace completer

}  // namespace softrdma::engine
