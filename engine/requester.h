// The requester transport unit (requester.cpp): SQ WQEs to request packets, within the window;
// resends, the tail-loss probe and the recovery state (IBTA vol 1, 9.4 and 9.7.3; rxe_req.c).
// Declared here, not in qp.h, so that qp_type.cpp can name the units without the QP's whole
// definition (one header per transport unit).
#pragma once

#include <cstdint>

#include "engine/congestion_window.h"
#include "engine/recovery.h"
#include "engine/transport.h"

namespace softrdma::engine {

class QueuePair;

/// Requester: turns WQEs into request packets within the PSN window and the
/// READ/ATOMIC credit (max_rd_atomic).
namespace requester {
/// Moves the QP's recovery state to `to` (engine/recovery.h), logging the transition at
/// debug with `cause` (a string literal); entering go-back-N, selective or probe sets where
/// it ends (req.max_psn). No effect on packets: the caller does what the state names.
void enter_recovery(QueuePair& qp, Recovery to, const char* cause);
/// A request the device dropped on a full same-host ring (Transport::on_local_drop's
/// caller): when `psn` is still outstanding and not already sent again, the window shrinks
/// to half of what was in flight (CongestionWindow::on_local_drop), the requester goes back
/// to `psn` (go-back-N) and returns true; otherwise false, nothing changed. The requester,
/// not the device, edits its PSNs.
bool on_local_drop(QueuePair& qp, uint32_t psn);
/// Sends as many request packets as window, credits, fences and state allow.
void run(QueuePair& qp, Transport& t);
/// SQ index of the started WQE whose PSNs hold `psn`, or qp.sq_end() when none does. Binary
/// search: started WQEs sit in PSN order from sq_base, so a retransmission costs
/// O(log WQEs in flight), not a walk over the window.
uint64_t find_wqe(QueuePair& qp, uint32_t psn);
/// Positions the requester at `psn` (go-back-N): the WQE holding it and the byte offset
/// of that PSN become the next to transmit; READ/ATOMIC credits after it are returned.
void rewind(QueuePair& qp, uint32_t psn);
/// PSNs sent and not yet acknowledged that the responder holds (placed out of order beyond
/// its expected PSN), as its latest selective ACK counted them (CompleterState::sack_epsn):
/// that count was of PSNs beyond the responder's expected PSN then; an ACK that has since
/// moved the oldest unacknowledged PSN past that point covered at most as many of them as it
/// moved over, and PSNs before that point not yet acknowledged arrived in order. Within
/// [0, PSNs outstanding]: a stale or forged count costs at most a window sent early, never
/// data (only ACKs complete WQEs). 0 without selective ACKs.
uint32_t held_psns(const QueuePair& qp);
/// The rate the requester paces at as of its last update, bytes/ns (0: unpaced): DCQCN's
/// rate with SOFTRDMA_CC=dcqcn, otherwise the window's pacing (requester.cpp pacing_rate).
/// Read-only: for traces and tests.
double pacing_rate_now(const QueuePair& qp);
/// Request packets in flight before the requester waits for ACKs, at most.
inline constexpr uint32_t kWindowPsns = CongestionWindow::kMaxPsns;
/// With selective ACKs the window bounds the PSNs in flight, not the span from the oldest
/// unacknowledged PSN; the span may reach this many windows (and kWindowPsns at most). A gap
/// at the head is repaired in about two round trips (its report, then the resend), a lost
/// resend in 1.5 SRTT more (completer::resend_check_ns): with a window of ~1.5 bandwidth-delay
/// products, the link delivers ~3.5–5 BDPs meanwhile — about 2.3–3.3 windows beyond the gap.
inline constexpr uint32_t kSpanPerWindow = 4;
/// Sends the packet that starts at `psn` again (a selective NAK named it), leaving the
/// requester's position alone: a SEND/WRITE segment, a READ request for the rest of its
/// chunk, or an atomic. `ack_req`: a SEND/WRITE segment asks for an ACK — set on the last
/// packet of each resent range and on the resend check's resend of the oldest PSN, so a
/// responder that already had them (their ACK was lost) answers (IBTA 9.7.5.1.3). Returns
/// the PSNs that packet covers (≥ 1), or 0 when no started WQE holds `psn`.
uint32_t resend(QueuePair& qp, Transport& t, uint32_t psn, bool ack_req);
/// Selective mode: asks again for the READ responses at PSNs [from, to) that were not placed
/// (SendWqe::read_placed) — a duplicate READ request for each run of them, cut at its WQE's and
/// chunk's ends and at SendWqe::read_cuts (IBTA 9.7.5.1.3.1: a duplicate lies within the READ
/// executed), leaving the requester's position alone. Every PSN in the range must belong to a
/// started READ WQE. `may_be_new`: the responder may not have executed the original request
/// (the tail-loss probe), so where a request stops short inside a chunk becomes a cut
/// (SendWqe::read_cuts). Returns the requests sent.
uint32_t ask_read_responses(QueuePair& qp, Transport& t, uint32_t from, uint32_t to,
                            bool may_be_new = false);
/// The tail-loss probe (completer::probe_timeout_ns): one PSN goes out again with AckReq,
/// leaving the requester's position alone. To a responder that has sent selective NAKs, the
/// last PSN sent: a duplicate draws an ACK (the ACK was lost), a PSN beyond a gap a selective
/// NAK. To any other, the oldest unacknowledged PSN (CompleterState::head_probe_end): a
/// go-back-N responder whose sequence NAK was lost drops the last PSN in silence, but answers
/// a duplicate with an ACK and takes its expected PSN; an ACK stopping short of what was sent
/// before the probe then starts go-back-N (completer.cpp note_progress). In selective mode, when
/// the oldest unanswered PSN belongs to a READ, the responses its chunk misses from there are asked
/// for instead (ask_read_responses). When the last PSN belongs to a READ or atomic otherwise — its
/// request resent would draw the whole chunk of responses again — the requester goes back to the
/// oldest unacknowledged PSN (a READ then asks only for the responses it misses). No window
/// collapse (the go-back-N after a short ACK halves it, as the lost NAK would have) and no retry
/// counted: the retransmit timer still runs. Returns false when nothing was outstanding to probe.
bool probe(QueuePair& qp, Transport& t);
/// Packets between AckReq bits inside a long message.
inline constexpr uint32_t kAckEvery = 32;
/// Most bytes of one WRITE placed in the responder's memory by one system call
/// (Transport::place_write): the device lock is held for the copy, ~100-200 µs at 5-10 GB/s.
inline constexpr uint64_t kPlaceRunBytes = 1 << 20;
/// A READ WQE is requested in chunks of at most this many response packets, so that
/// max_rd_atomic and the PSN window also pace read responses.
inline constexpr uint32_t kReadChunkPsns = 32;
}  // namespace requester

}  // namespace softrdma::engine
