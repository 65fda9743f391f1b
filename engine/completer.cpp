// Completer: ACK/NAK, read responses, atomic ACKs → send CQEs; retransmit and RNR timers
// (IBTA vol 1, 9.7.5.2 requester side of ACK/NAK protocol, 9.7.6 retries; rxe_comp.c).
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "engine/cq.h"
#include "engine/log.h"
#include "engine/qp.h"
#include "net/fault_guard.h"

namespace softrdma::engine::completer {

namespace {

using wire::psn_add;
using wire::psn_diff;

bool ask_for_unanswered(QueuePair& qp, Transport& t, uint32_t upto);

// Moves `mark` (a PSN, or kNoPsn for none) forward to `psn` unless it lies beyond already.
void raise_mark(uint32_t& mark, uint32_t psn) {
  if (mark == kNoPsn || psn_diff(psn, mark) > 0) mark = psn;
}

// Go-back-N from `psn` (`why`: a string literal, logged); the recovery state becomes `state`
// (go-back-N, or the RNR wait before it).
void retry_from(QueuePair& qp, uint32_t psn, const char* why, Recovery state = Recovery::kGoBackN) {
  log().debug("qp {:#x}: go back to psn {:#x} ({}; comp.psn {:#x} req.psn {:#x} cwnd {})", qp.qpn(),
              psn, why, qp.comp.psn, qp.req.psn, qp.req.window.psns());
  requester::enter_recovery(qp, state, why);
  requester::rewind(qp, psn);
}

// `lost` PSNs reported missing outside a recovery episode: one starts (recovery_psn: what
// was sent so far), unless the window takes the loss for random (CongestionWindow::
// on_sequence_nak: counter random_losses). Paced by DCQCN the window is left alone.
void judge_loss(QueuePair& qp, Transport& t, uint32_t lost) {
  CongestionWindow& w = qp.req.window;
  const uint32_t before = w.psns();
  const bool queue = w.queue_building();
  if (qp.req.cc_on || w.on_sequence_nak(t.now_ns(), lost)) {
    qp.comp.recovery_psn = qp.req.max_psn;
    // Why the window shrank (or, paced by DCQCN, why it did not): the trace that tells a
    // standing queue from a burst of losses (docs/wide-area.md, the 1 % rows).
    log().debug(
        "qp {:#x}: loss of {} PSNs is congestion ({}): window {} -> {} (latest RTT {} us, "
        "smallest {} us)",
        qp.qpn(), lost,
        qp.req.cc_on ? "DCQCN paces; window kept"
        : queue      ? "a standing queue in the round trip"
                : fmt::format("{} PSNs lost this round, over the burst share", w.lost_in_round()),
        before, w.psns(), w.last_rtt_ns() / 1000, w.min_rtt_ns() / 1000);
  } else {
    bump(t.counters().random_losses);
  }
}

// The partial-ACK case below (an ACK stopped right after `again_psn`, the oldest PSN the
// resend check sent again) with a selective peer that has named gaps from the new head on:
// the head or PSNs after it were resent (selective NAKs) before that resend-again, so the
// responder saw packets beyond them and placed those out of order. What it still misses is what
// those resends left: a resend lost too, or refused (a resend arriving behind a lost one, or a
// middle packet of a message whose first packet was missing when it came). So the head and
// each PSN resent after it before `again_psn`'s resend go once more, not everything after
// the head: go-back-N there resent every packet placed beyond (a loaded ASan run resent
// 1,159 of them for 12 link losses). Returns false — go back N — when nothing from the
// head on was resent (a burst lost to the end of what was sent, which no later packet
// revealed).
bool resend_lost_resends(QueuePair& qp, Transport& t, uint32_t again_psn) {
  if (!qp.comp.peer_selective) return false;
  uint64_t again_ns = 0;  // when the resend check sent again_psn
  for (const CompleterState::Resent& r : qp.comp.resent)
    if (r.psn == again_psn) again_ns = std::max(again_ns, r.sent_ns);
  std::vector<uint32_t> psns;
  for (const CompleterState::Resent& r : qp.comp.resent)
    if (psn_diff(r.psn, qp.comp.psn) >= 0 && r.sent_ns <= again_ns) psns.push_back(r.psn);
  if (psns.empty()) return false;
  psns.push_back(qp.comp.psn);
  const uint32_t head = qp.comp.psn;
  std::sort(psns.begin(), psns.end(),
            [head](uint32_t x, uint32_t y) { return psn_diff(x, head) < psn_diff(y, head); });
  psns.erase(std::unique(psns.begin(), psns.end()), psns.end());
  bump(t.counters().partial_ack_resends);
  // Lost resends are losses of the episode their selective NAK began (NewReno: one cut per
  // episode, RFC 6582 3.2); only outside one do they count, judged as on_selective_nak
  // judges a NAK (DCQCN's rate, or the window's random-or-congestion rule).
  if (!qp.req.cc_on && qp.comp.recovery_psn == kNoPsn)
    judge_loss(qp, t, static_cast<uint32_t>(psns.size()));
  log().debug("qp {:#x}: ACK stopped after psn {:#x}: {} PSNs resent before it go again", qp.qpn(),
              again_psn, psns.size());
  for (size_t i = 0; i < psns.size(); ++i)
    requester::resend(qp, t, psns[i], /*ack_req=*/i + 1 == psns.size());
  return true;
}

// PSNs newly delivered, for the window's delivery rate and growth, when the oldest
// unacknowledged PSN has just moved `advanced` PSNs (0 for a selective ACK or a READ response
// placed ahead): what it moved over plus the change, since last counted, of what arrived
// beyond it — the PSNs the responder holds beyond a gap (requester::held_psns) and the READ
// responses placed beyond one (CompleterState::read_ahead). Those arrived when the selective
// ACK said so or the response came, and the gap's repair alone is new. BBR's delivery rate
// counts SACKed packets so (Cardwell et al. 2016), and Linux grows the window by acked +
// sacked; a repaired gap's whole cumulative jump, counted at once, is a delivery rate sample
// the link never carried (a READ stream on a 125 MB/s link measured 186-210 MB/s so).
uint32_t newly_delivered(QueuePair& qp, uint32_t advanced) {
  const uint32_t held = requester::held_psns(qp) + qp.comp.read_ahead;
  const int64_t delivered = int64_t{advanced} + held - qp.comp.sack_counted;
  qp.comp.sack_counted = held;
  return uint32_t(std::max<int64_t>(delivered, 0));
}

// At debug level, a sample of the requester's state at most every kTraceIntervalNs of the
// (dilated) clock, taken at an ACK that delivered: how a long transfer's window, pacing and
// posted work evolve without a line per ACK (a 10 GiB hand-off over 100 Gbit/s × 50 ms is
// ~100 samples per QP). Fields: the window, what of it the QPs towards the peer leave this
// one (CongestionWindow::flight_psns) and the slow-start threshold (PSNs), the PSNs in
// flight (span less those held beyond a gap), the train's and the largest delivery rate
// (Gbit/s of payload at this MTU), the smallest and smoothed RTT (µs), the pacing rate
// (Gbit/s, 0: unpaced) and the WQEs posted and not yet completed (the SQ's occupancy).
constexpr uint64_t kTraceIntervalNs = 10'000'000;

void trace_window(QueuePair& qp, uint64_t now) {
  if (now - qp.comp.trace_ns < kTraceIntervalNs || !log().should_log(spdlog::level::debug)) return;
  qp.comp.trace_ns = now;
  const CongestionWindow& w = qp.req.window;
  const double gbit_per_psn_ns = 8.0 * qp.mtu;  // PSNs/ns → Gbit/s
  const int32_t span = psn_diff(qp.req.psn, qp.comp.psn);
  log().debug(
      "qp {:#x}: window {} shared {} ssthresh {} in flight {} span {} train {:.2f} rate {:.2f} "
      "Gbit/s min_rtt {} srtt {} us paced {:.2f} Gbit/s wqes {}",
      qp.qpn(), w.psns(), w.flight_psns(), w.threshold(), span - int64_t{requester::held_psns(qp)},
      span, w.train_rate() * gbit_per_psn_ns, w.delivery_rate() * gbit_per_psn_ns,
      w.min_rtt_ns() / 1000, w.srtt_ns() / 1000, requester::pacing_rate_now(qp) * 8.0,
      qp.sq.size());
}

// Tells the window what newly_delivered counts (after a round-trip sample, if any) and
// restarts the tail-loss probe's wait when something was delivered.
void count_delivered(QueuePair& qp, Transport& t, uint32_t advanced) {
  const uint32_t n = newly_delivered(qp, advanced);
  if (!n) return;
  const uint64_t now = t.now_ns();
  // An ACK of nothing but what left before the sender ran dry and paused (RequesterState::
  // flight_psn) starts no ACK train.
  bool before_flight = false;
  if (qp.req.flight_psn != kNoPsn) {
    before_flight = psn_diff(qp.comp.psn, qp.req.flight_psn) <= 0;
    if (!before_flight) qp.req.flight_psn = kNoPsn;
  }
  qp.req.window.on_delivered(n, now, /*train_origin=*/!before_flight);
  qp.req.window.on_acked(n);
  qp.comp.last_delivery_ns = now;
  trace_window(qp, now);
}

// The latest resend of `psn` (requester::resend); nullptr when it was not resent since the
// ACK last passed it. Scans comp.resent (one entry per resend not yet acknowledged: the
// losses of the window, ~450 at 100 Gbit/s x 50 ms and 0.1 %), so it runs at a resend check
// or when the head moves onto a resent PSN, not at every ACK.
const CompleterState::Resent* last_resend(const QueuePair& qp, uint32_t psn) {
  const CompleterState::Resent* last = nullptr;
  for (const CompleterState::Resent& r : qp.comp.resent)
    if (r.psn == psn && (!last || r.sent_ns >= last->sent_ns)) last = &r;
  return last;
}

// The oldest unacknowledged PSN once more, asking for its ACK: its resend or the selective
// NAK naming it was lost (check_resends, resend_if_sack_proves_lost). Recorded by
// requester::resend, so it is watched again; an ACK that then stops right after it says the
// next PSN is missing too (again_psn, note_progress).
void resend_head_again(QueuePair& qp, Transport& t) {
  bump(t.counters().resend_again_pkts);
  requester::resend(qp, t, qp.comp.psn, /*ack_req=*/true);
  qp.comp.again_psn = qp.comp.psn;
}

void note_progress(QueuePair& qp, Transport& t, uint32_t old_psn) {
  const uint64_t now = t.now_ns();
  if (qp.req.timed_psn != kNoPsn && psn_diff(qp.comp.psn, qp.req.timed_psn) > 0) {
    if (!qp.req.timed_behind_gap) qp.req.window.on_rtt_sample(now - qp.req.timed_ns);
    qp.req.timed_psn = kNoPsn;
  }
  count_delivered(qp, t, uint32_t(psn_diff(qp.comp.psn, old_psn)));
  qp.comp.retry_left = qp.attr.retry_cnt;
  qp.comp.rnr_retry_left = qp.attr.rnr_retry;
  qp.comp.nak_retry_started = false;
  qp.comp.last_progress_ns = now;
  qp.comp.stalled_since_ns = 0;
  qp.comp.probe_sent = false;
  // The go-back-N probe's answer (requester::probe): PSNs sent before the probe, two round
  // trips old, still unacknowledged — the responder dropped them behind a gap.
  const bool probe_short =
      qp.comp.head_probe_end != kNoPsn && psn_diff(qp.comp.head_probe_end, qp.comp.psn) > 0;
  qp.comp.head_probe_end = kNoPsn;
  const Recovery rec = qp.req.recovery;
  if (rec == Recovery::kProbe)
    requester::enter_recovery(qp, Recovery::kNone, "ACK progress after the tail-loss probe");
  else if ((rec == Recovery::kGoBackN || rec == Recovery::kSelective) &&
           psn_diff(qp.comp.psn, qp.req.recovery_end) >= 0)
    requester::enter_recovery(qp, Recovery::kNone, "everything sent before the loss acknowledged");
  if (!qp.comp.probe_ns && psn_diff(qp.req.psn, qp.comp.psn) > 0) {
    // Still outstanding and nothing sent since: watch the tail from here.
    if (const uint64_t pto = probe_timeout_ns(qp)) {
      qp.comp.probe_ns = now + pto;
      t.timer_armed(qp, qp.comp.probe_ns);
    }
  }
  if (qp.comp.recovery_psn != kNoPsn && psn_diff(qp.comp.psn, qp.comp.recovery_psn) >= 0)
    qp.comp.recovery_psn = kNoPsn;  // everything sent before the loss is acknowledged
  // Passed marks are dropped, so that none is read against PSNs 2^23 later (serial numbers).
  if (qp.comp.read_gap_end != kNoPsn && psn_diff(qp.comp.psn, qp.comp.read_gap_end) >= 0)
    qp.comp.read_gap_end = kNoPsn;
  if (qp.comp.acked_beyond != kNoPsn && psn_diff(qp.comp.psn, qp.comp.acked_beyond) > 0)
    qp.comp.acked_beyond = kNoPsn;
  auto& inflight = qp.comp.rd_atomic_inflight;
  while (!inflight.empty() && psn_diff(inflight.front(), qp.comp.psn) < 0) inflight.pop_front();
  qp.comp.head_since_ns = now;
  auto& resent = qp.comp.resent;
  // PSNs sent and unacknowledged, the oldest a SEND/WRITE's: what a go-back-N from the head
  // would send again (an unanswered READ or atomic has its own recovery).
  const bool writes_outstanding = psn_diff(qp.req.psn, qp.comp.psn) > 0 && !qp.sq.empty() &&
                                  qp.sq.front().started && !qp.sq.front().info().read_or_atomic;
  // A partial ACK that answers the oldest PSN's resend-again (below) and stops right after
  // it: the responder misses the next PSN as well, although it was sent — and, in a burst
  // loss, resent too — before that resend. The burst was lost (a full socket buffer drops
  // thousands at once, and the selective resends of a whole NAKed range with them), so go
  // back N from the new head now, the window starting again as after a timeout: what the
  // retransmit timer would do, but the resend-again's ACK keeps re-arming it, and one head
  // per resend check (1.5 SRTT) crawled (ib_write_bw 8 MiB over UDP: 5-70 MB/s against
  // ~3 GB/s). NewReno's partial-ACK rule (RFC 6582 3.2), with go-back-N for its one resend.
  const bool tail_lost = qp.comp.again_psn != kNoPsn &&
                         qp.comp.psn == psn_add(qp.comp.again_psn, 1) && writes_outstanding;
  const uint32_t again_psn = qp.comp.again_psn;
  qp.comp.again_psn = kNoPsn;
  if (probe_short && writes_outstanding) {
    // As the sequence NAK that was lost would have (on_ack's kPsnSequenceError).
    bump(t.counters().partial_ack_rewinds);
    if (!qp.req.window.on_sequence_nak(now)) bump(t.counters().random_losses);
    retry_from(qp, qp.comp.psn, "the probe's ACK stopped short: the responder dropped the rest");
    return;
  }
  if (tail_lost) {
    if (resend_lost_resends(qp, t, again_psn)) return;
    bump(t.counters().partial_ack_rewinds);
    qp.comp.recovery_psn = kNoPsn;
    // On a long path a window restarted from one PSN takes many round trips to refill
    // (seconds at 50 ms): halve as for a congestion loss instead (floor 1.5 BDPs).
    if (qp.req.window.long_path())
      qp.req.window.on_sequence_nak(now, qp.req.window.psns());
    else
      qp.req.window.on_timeout();
    retry_from(qp, qp.comp.psn, "partial ACK of a resend-again: the packets after it were lost");
    return;
  }
  while (!resent.empty() && psn_diff(resent.front().psn, qp.comp.psn) < 0) resent.pop_front();
  // A new oldest PSN that was resent is judged from its resend (check_resends): when that
  // is already 1.5 SRTT old, the check is due now, not where the previous head had it.
  // Resends are recorded mostly in PSN order (selective NAKs name gaps in order), so a
  // resent head is usually the front entry; one further back (resent again out of order)
  // waits for the check armed already, where check_resends' scan finds it.
  qp.comp.head_resent_before = kNoPsn;
  if (qp.comp.peer_selective && !resent.empty() && resent.front().psn == qp.comp.psn) {
    const CompleterState::Resent* r = last_resend(qp, qp.comp.psn);
    if (r) qp.comp.head_resent_before = r->max_psn;
    const uint64_t check = resend_check_ns(qp);
    if (r && check) {
      const uint64_t due = std::max(now + 1, r->sent_ns + check);
      if (!qp.comp.resend_check_ns || due < qp.comp.resend_check_ns) {
        qp.comp.resend_check_ns = due;
        t.timer_armed(qp, due);
      }
    }
  }
  // A late ACK or response can acknowledge PSNs the requester, after a go-back-N rewind,
  // was about to send again: move it forward so its next PSN and the WQE/offset it sends
  // from stay in step.
  if (psn_diff(qp.comp.psn, qp.req.psn) > 0) requester::rewind(qp, qp.comp.psn);
}

// Everything up to and including `psn` is acknowledged. Completes SEND/WRITE WQEs that it
// covers. Returns false when it covers a READ/ATOMIC whose response has not arrived: that
// response was lost (an ACK for a later PSN implies it was sent), so the caller retries.
bool complete_acked(QueuePair& qp, Transport& t, uint32_t psn) {
  bool progress = false, ok = true;
  const uint32_t old_psn = qp.comp.psn;
  while (!qp.sq.empty()) {
    SendWqe& w = qp.sq.front();
    if (!w.started || psn_diff(psn, qp.comp.psn) < 0) break;
    if (w.info().read_or_atomic) {
      ok = false;  // psn ≥ comp.psn lies in or beyond an unanswered READ/ATOMIC
      break;
    }
    if (psn_diff(psn, w.last_psn()) < 0) {
      qp.comp.psn = psn_add(psn, 1);  // part of a multi-packet message
      progress = true;
      break;
    }
    qp.comp.psn = psn_add(w.last_psn(), 1);
    progress = true;
    qp.retire_send(WcStatus::kSuccess, static_cast<uint32_t>(w.length));
  }
  if (progress) note_progress(qp, t, old_psn);
  return ok;
}

// A retransmit timeout with nothing heard from the peer: asks the device why (engine
// Transport::peer_liveness). A dead peer fails the QP now, naming it, instead of after
// retry_cnt more timeouts; a stalled one (stopped, or starved of CPU) costs no retry for up
// to kMaxPeerStallNs since the first such timeout — a NIC would have acknowledged for it
// meanwhile. False when the timeout does not count against retry_cnt (or the QP failed:
// see its state).
bool timeout_counts(QueuePair& qp, Transport& t, uint64_t now) {
  std::string who;
  switch (t.peer_liveness(qp, &who)) {
    case PeerLiveness::kDead:
      log().warn("qp {:#x}: peer {}: IBV_WC_RETRY_EXC_ERR at psn {:#x}", qp.qpn(), who,
                 qp.comp.psn);
      bump(t.counters().dead_peer_err);
      bump(t.counters().retry_exceeded_err);
      qp.enter_error(WcStatus::kRetryExcErr);
      return false;
    case PeerLiveness::kStalled:
      if (!qp.comp.stalled_since_ns) qp.comp.stalled_since_ns = now;
      if (now - qp.comp.stalled_since_ns < kMaxPeerStallNs) {
        bump(t.counters().stalled_peer_timeouts);
        log().debug("qp {:#x}: peer {} did not run: timeout not counted", qp.qpn(), who);
        return false;
      }
      log().warn("qp {:#x}: peer {} stalled for {} s: retries count again", qp.qpn(), who,
                 (now - qp.comp.stalled_since_ns) / 1'000'000'000);
      return true;
    case PeerLiveness::kUnknown:
    case PeerLiveness::kRunning:
      break;
  }
  return true;
}

bool retry_budget(QueuePair& qp, Transport& t) {
  if (qp.comp.retry_left == 0) {
    log().warn("qp {:#x}: retry_cnt {} exhausted at psn {:#x}", qp.qpn(), qp.attr.retry_cnt,
               qp.comp.psn);
    bump(t.counters().retry_exceeded_err);
    qp.enter_error(WcStatus::kRetryExcErr);
    return false;
  }
  --qp.comp.retry_left;
  return true;
}

// A response ahead of the one expected: an earlier one was lost. Rewind once per
// expected PSN rather than waiting for the retransmit timer.
void fast_retry(QueuePair& qp, Transport& t) {
  if (qp.comp.fast_retry_psn == qp.comp.psn) return;
  qp.comp.fast_retry_psn = qp.comp.psn;
  bump(t.counters().rcvd_stale_response);
  retry_from(qp, qp.comp.psn, "response out of order");
}

// Resends the PSNs [r.first, r.last] (all sent before) that the responder reports missing —
// a selective NAK's range, or a run a selective ACK lists whose NAK or resend was lost
// (`cause`): queued in req.retx, sent before any new PSN. With `judge`, the loss is judged
// first (judge_loss); a lost resend's loss was judged at its NAK, as resend_head_again's is.
void repair_range(QueuePair& qp, Transport& t, PsnRange r, const char* cause, bool judge = true);

// A selective NAK: PSNs [BTH.PSN, AETH.MSN] are missing at the responder, which kept what
// came around them. Queue exactly that range for the requester; acknowledge nothing. The
// window halves once per recovery episode (the first loss of what was in flight then).

void on_selective_nak(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  bump(t.counters().selective_nak_rcvd);
  qp.comp.peer_selective = true;
  PsnRange r{pkt.hdr.bth.psn, pkt.hdr.aeth.msn & wire::kPsnMask};
  if (psn_diff(r.last, r.first) < 0 || psn_diff(r.first, qp.req.max_psn) >= 0) {
    bump(t.counters().rcvd_malformed);  // not a range of PSNs sent: a forged or broken NAK
    return;
  }
  if (psn_diff(r.last, qp.req.max_psn) >= 0) {
    // Past what was ever sent: the responder saw a forged PSN that far ahead (or the NAK is
    // forged). What was sent of it may be missing, the rest is nobody's: resend the former.
    bump(t.counters().selective_nak_clipped);
    r.last = psn_add(qp.req.max_psn, wire::kPsnMask);
  }
  repair_range(qp, t, r, "selective NAK");
}

void repair_range(QueuePair& qp, Transport& t, PsnRange r, const char* cause, bool judge) {
  if (psn_diff(r.last, qp.comp.psn) < 0) return;  // all acknowledged since
  if (psn_diff(r.first, qp.comp.psn) < 0) r.first = qp.comp.psn;
  if (qp.req.rnr_wait()) return;  // the RNR retry goes back to comp.psn and sends it all
  if (judge && (qp.comp.recovery_psn == kNoPsn || psn_diff(r.first, qp.comp.recovery_psn) >= 0)) {
    // Paced by DCQCN, a loss is only a loss: the rate answers congestion (CNPs come before
    // the queue overflows), the window keeps what is in flight — IRN's split of loss
    // recovery from congestion control (Mittal et al. 2018, 3.3). Otherwise TCP's halving,
    // unless the window takes it for a random loss (CongestionWindow::on_sequence_nak):
    // then no recovery episode starts, so the next loss is judged again.
    judge_loss(qp, t, uint32_t(psn_diff(r.last, r.first)) + 1);
  }
  log().debug("qp {:#x}: {} {:#x}…{:#x} (comp.psn {:#x} req.psn {:#x} cwnd {} held {} srtt {} us)",
              qp.qpn(), cause, r.first, r.last, qp.comp.psn, qp.req.psn, qp.req.window.psns(),
              requester::held_psns(qp), qp.req.window.srtt_ns() / 1000);
  if (qp.req.recovery == Recovery::kNone || qp.req.recovery == Recovery::kProbe)
    requester::enter_recovery(qp, Recovery::kSelective, cause);
  qp.req.retx.push_back(r);
}

// Whether every packet of the PSNs [r.first, r.last] is one a selective responder keeps
// beyond a gap: an RDMA WRITE's (placed: responder.cpp place_early) or a SEND's (staged:
// stage_early, as is the last packet of a WRITE with immediate) — not a READ request or an
// atomic, which execute in order only.
bool kept_beyond_gap(QueuePair& qp, PsnRange r) {
  for (uint64_t idx = requester::find_wqe(qp, r.first); idx < qp.sq_end(); ++idx) {
    const SendWqe& w = qp.wqe(idx);
    const WrClass c = w.info().cls;
    if (!w.started || (c != WrClass::kWrite && c != WrClass::kSend)) return false;
    if (psn_diff(w.last_psn(), r.last) >= 0) return true;
  }
  return false;
}

// A selective ACK's list of runs still missing up to the highest PSN that arrived (wire::
// SackReport; to a requester that set Bth::sack_ranges). A run other than the one at the
// oldest unacknowledged PSN (resend_if_sack_proves_lost and the resend check watch that one)
// is repaired again
// - when its first PSN was not resent since its loss and no resend of it is queued: the
//   selective NAK that named it was lost (the responder sends a gap's NAK before any
//   selective ACK that lists it, on the same path);
// - when that PSN's latest resend left before PSN `highest` was first sent: a later packet
//   arrived, the path keeps order, so the resend was lost (RACK, RFC 8985 6.2); not judged
//   again.
// Otherwise (the old rule) such a loss waited until its gap became the oldest PSN. A lost
// NAK's run is resent whatever it holds, once, as the NAK would have had it; a lost resend only
// for runs of packets the responder keeps beyond a gap (kept_beyond_gap): a READ request
// resent behind a gap still open is dropped there again — "lost" by this rule at every look
// until the gap is repaired — so it waits for that gap, as before. A lost NAK's run is judged
// as the NAK would have been (repair_range); a forged list costs resends of PSNs that were
// sent, nothing else.
void repair_listed_runs(QueuePair& qp, Transport& t, const wire::SackReport& rep) {
  if (rep.count == 0 || qp.req.recovery == Recovery::kGoBackN || qp.req.rnr_wait()) return;
  const uint64_t now = t.now_ns();
  if (now < qp.comp.sack_runs_ns) return;
  for (uint32_t i = 0; i < rep.count; ++i) {
    const PsnRange r{rep.ranges[i].first, rep.ranges[i].last};
    if (psn_diff(r.first, qp.comp.psn) <= 0) continue;         // the oldest's, or acknowledged
    qp.comp.sack_runs_ns = now + qp.req.window.srtt_ns() / 8;  // a look at a run: the cost
    const bool queued = std::any_of(qp.req.retx.begin(), qp.req.retx.end(), [&](const PsnRange& q) {
      return psn_diff(r.first, q.first) >= 0 && psn_diff(q.last, r.first) >= 0;
    });
    if (queued) continue;
    const CompleterState::Resent* last = last_resend(qp, r.first);
    if (last && (!kept_beyond_gap(qp, r) || psn_diff(rep.highest, last->max_psn) < 0)) continue;
    bump(t.counters().selective_runs_repaired);
    if (last)
      repair_range(qp, t, r, "resend lost (selective ACK's list)", /*judge=*/false);
    else
      repair_range(qp, t, r, "NAK lost (selective ACK's list)");
  }
}

// A selective ACK that still expects the oldest unacknowledged PSN, whose latest resend left
// before PSN head_resent_before was first sent, and holds more PSNs beyond it than lie before
// that PSN: one sent after the resend has arrived, and the path keeps order, so the resend
// was lost — sent again now (the resend check, its fallback, would wait 1.5 SRTT from the
// resend; this knows one round trip after it). RACK's rule (RFC 8985 6.2: a packet is lost
// once one sent after it is delivered), counted by PSNs since the selective ACK carries a
// count, not a list. At 100 Gbit/s x 50 ms and 0.1 % loss ~6 resends of 6,400 are lost per
// 25 GiB, each holding every WRITE behind it (docs/wide-area.md). A path that reorders can
// make it resend a PSN that was on its way: one duplicate, re-acknowledged.
void resend_if_sack_proves_lost(QueuePair& qp, Transport& t, uint32_t epsn, uint32_t held) {
  const uint32_t before = qp.comp.head_resent_before;
  if (before == kNoPsn || epsn != qp.comp.psn || !t.selective_retransmit() || qp.req.rnr_wait() ||
      qp.sq.empty() || !qp.sq.front().started || qp.sq.front().info().read_or_atomic)
    return;
  const int32_t sent_before = psn_diff(before, epsn) - 1;  // PSNs after the head sent before
  if (sent_before < 0 || int64_t{held} <= sent_before) return;
  log().debug(
      "qp {:#x}: psn {:#x}'s resend lost: the responder holds {} PSNs beyond it, {} "
      "were sent before the resend: again",
      qp.qpn(), epsn, held, sent_before);
  resend_head_again(qp, t);  // sets head_resent_before anew
}

// A selective ACK: the responder expected BTH.PSN and held AETH.MSN PSNs beyond it. Kept
// for the window (requester.cpp held_psns); it acknowledges nothing. The newest report wins.
// on_response has dropped one whose PSN was never sent or is acknowledged already; one that
// holds as many PSNs as were sent from its expected PSN on (which it lacks) is malformed.
void on_selective_ack(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t epsn = pkt.hdr.bth.psn;
  const uint32_t held = pkt.hdr.aeth.msn & wire::kPsnMask;
  if (held >= uint32_t(psn_diff(qp.req.max_psn, epsn))) {
    bump(t.counters().rcvd_malformed);
    return;
  }
  if (qp.comp.sack_epsn != kNoPsn && psn_diff(epsn, qp.comp.sack_epsn) < 0) return;  // older
  bump(t.counters().selective_ack_rcvd);
  qp.comp.peer_selective = true;
  qp.comp.sack_epsn = epsn;
  qp.comp.sack_held = held;
  // The timed PSN is d beyond the expected one, which is missing: once the responder holds
  // d PSNs beyond it, the timed one or one sent just after it has arrived (the link keeps
  // order; d - 1 PSNs lie between) — its round trip, now, rather than after the repair of
  // the gap lets the cumulative ACK pass it. Under 1 % loss a gap comes every round trip
  // and the cumulative samples stopped: SRTT froze and queue_building() went blind.
  if (qp.req.timed_psn != kNoPsn) {
    const int32_t d = psn_diff(qp.req.timed_psn, epsn);
    if (d > 0 && held >= uint32_t(d)) {
      qp.req.window.on_rtt_sample(t.now_ns() - qp.req.timed_ns);
      qp.req.timed_psn = kNoPsn;
    }
  }
  count_delivered(qp, t, 0);
  resend_if_sack_proves_lost(qp, t, epsn, held);
  if (!pkt.payload.empty()) {
    wire::SackReport rep;
    // The list must name PSNs sent, up to the highest one that arrived, which was sent too.
    if (!wire::decode_sack_report(pkt.payload, rep) || psn_diff(rep.highest, epsn) < 0 ||
        psn_diff(rep.highest, qp.req.max_psn) >= 0 ||
        (rep.count && psn_diff(rep.ranges[0].first, epsn) < 0)) {
      bump(t.counters().rcvd_malformed);
      return;
    }
    repair_listed_runs(qp, t, rep);
  }
}

void on_ack(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t psn = pkt.hdr.bth.psn;
  const uint8_t syn = pkt.hdr.aeth.syndrome;
  if (syn == wire::aeth_nak(wire::NakCode::kSelectiveRetransmit)) {
    if (t.selective_retransmit()) return on_selective_nak(qp, pkt, t);
    bump(t.counters().rcvd_malformed);  // we never asked for one: ignore it, the timer recovers
    return;
  }
  if (syn == wire::aeth_nak(wire::NakCode::kSelectiveAck)) {
    if (t.selective_retransmit()) return on_selective_ack(qp, pkt, t);
    bump(t.counters().rcvd_malformed);  // we never asked for one
    return;
  }
  switch (wire::aeth_kind(syn)) {
    case wire::AckKind::kAck:
      if (!complete_acked(qp, t, psn) && !ask_for_unanswered(qp, t, psn)) fast_retry(qp, t);
      return;
    case wire::AckKind::kRnrNak: {
      bump(t.counters().rcvd_rnr_err);
      complete_acked(qp, t, psn_add(psn, wire::kPsnMask));  // psn − 1
      if (qp.comp.rnr_retry_left == 0) {
        bump(t.counters().retry_rnr_exceeded_err);
        qp.enter_error(WcStatus::kRnrRetryExcErr);
        return;
      }
      if (qp.attr.rnr_retry != 7) --qp.comp.rnr_retry_left;  // 7 means retry forever
      retry_from(qp, psn, "RNR NAK", Recovery::kRnrWait);
      qp.comp.rnr_ns = t.now_ns() + uint64_t{wire::rnr_timer_usec(syn & 0x1f)} * 1000;
      t.timer_armed(qp, qp.comp.rnr_ns);
      return;
    }
    case wire::AckKind::kNak: {
      bump(t.counters().rcvd_nak);
      const bool progressed = psn_diff(psn, qp.comp.psn) > 0;
      complete_acked(qp, t, psn_add(psn, wire::kPsnMask));
      switch (static_cast<wire::NakCode>(syn & 0x1f)) {
        case wire::NakCode::kPsnSequenceError:
          bump(t.counters().rcvd_seq_err);
          if (qp.req.rnr_wait()) return;  // the RNR retry goes back to this PSN anyway
          if (!progressed) {
            // Once a NAK has started a go-back-N, more NAKs for the same PSN before any
            // progress start no other (rxe: "if we've started a retry, don't start another
            // retry sequence, unless this is a timeout"). Otherwise each request an attacker
            // forges far ahead of the responder's expected PSN — each draws a genuine
            // sequence NAK — cost a go-back-N round and one retry, and a few of them
            // exhausted retry_cnt (observed under load in the hostile-packet tests).
            if (qp.comp.nak_retry_started) return;
            if (!retry_budget(qp, t)) return;
            qp.comp.nak_retry_started = true;
          }
          if (!qp.req.window.on_sequence_nak(t.now_ns())) bump(t.counters().random_losses);
          retry_from(qp, psn, "sequence NAK");
          return;
        case wire::NakCode::kRemoteAccessError:
          qp.enter_error(WcStatus::kRemAccessErr);
          return;
        case wire::NakCode::kRemoteOperationalError:
          qp.enter_error(WcStatus::kRemOpErr);
          return;
        case wire::NakCode::kInvalidRequest:
        case wire::NakCode::kInvalidRdRequest:
        default:
          qp.enter_error(WcStatus::kRemInvReqErr);
          return;
      }
    }
    case wire::AckKind::kReserved:
      bump(t.counters().rcvd_malformed);
      return;
  }
}

// Calls f(address, at, n) for each piece of the WQE's local buffers that bytes
// [offset, offset + len) of its message occupy, in order: `n` bytes at `address`, which are
// bytes [at, at + n) of the range. Stops and returns false at the first f that does.
template <class F>
bool for_local_pieces(const SendWqe& w, uint64_t offset, size_t len, F&& f) {
  size_t done = 0;
  for (const iovec& v : w.local) {
    if (done == len) break;
    if (offset >= v.iov_len) {
      offset -= v.iov_len;
      continue;
    }
    const size_t n = std::min<size_t>(v.iov_len - offset, len - done);
    if (!f(static_cast<uint8_t*>(v.iov_base) + offset, done, n)) return false;
    done += n;
    offset = 0;
  }
  return true;
}

// Copies `data` into the WQE's local buffers at byte `offset`. False when a buffer was
// unmapped since registration (the copy faulted; net/fault_guard.h).
bool scatter(SendWqe& w, uint64_t offset, std::span<const uint8_t> data) {
  return for_local_pieces(w, offset, data.size(), [&](uint8_t* p, size_t at, size_t n) {
    return net::guarded_copy(p, data.data() + at, n);
  });
}

// Whether the WQE's local buffers hold `data` at byte `offset` (false as well when a buffer
// was unmapped since registration).
bool holds(const SendWqe& w, uint64_t offset, std::span<const uint8_t> data) {
  struct Args {
    const SendWqe* w;
    uint64_t offset;
    std::span<const uint8_t> data;
    bool same = false;
  } args{&w, offset, data};
  const bool ran = net::guarded_call(
      [](void* v) {
        Args& a = *static_cast<Args*>(v);
        a.same = for_local_pieces(*a.w, a.offset, a.data.size(),
                                  [&a](const uint8_t* p, size_t at, size_t n) {
                                    return std::memcmp(p, a.data.data() + at, n) == 0;
                                  });
      },
      &args);
  return ran && args.same;
}

// A READ response or atomic result found its local buffer unmapped: a local protection
// error of that WQE (IBTA 10.6.3; rxe's copy_data failure), the QP to ERR.
void fail_local_buffer(QueuePair& qp, Transport& t) {
  bump(t.counters().local_access_faults);
  log().debug("qp {:#x}: local buffer of WQE {} unmapped", qp.qpn(), qp.sq_base);
  qp.enter_error(WcStatus::kLocProtErr);
}

// The WQE a READ response or atomic ACK at `pkt`'s PSN answers, or nullptr when the packet
// must be dropped. Such a response implicitly acknowledges every earlier request (IBTA
// 9.7.5.1.2); one ahead of the expected PSN means an earlier response was lost.
SendWqe* answered_wqe(QueuePair& qp, const wire::Packet& pkt, Transport& t, WrClass cls) {
  const uint32_t psn = pkt.hdr.bth.psn;
  if (!complete_acked(qp, t, psn_add(psn, wire::kPsnMask)) || psn != qp.comp.psn) {
    fast_retry(qp, t);
    return nullptr;
  }
  if (qp.sq.empty()) return nullptr;
  SendWqe& w = qp.sq.front();
  if (!w.started || w.info().cls != cls || psn_diff(psn, w.last_psn()) > 0) {
    bump(t.counters().rcvd_stale_response);
    return nullptr;
  }
  return &w;
}

// The byte offset in `w` of the READ response at `psn`, or UINT64_MAX (counted malformed)
// when `pkt`'s payload is not the size that PSN carries.
uint64_t read_response_offset(const QueuePair& qp, const SendWqe& w, const wire::Packet& pkt,
                              Transport& t) {
  const uint32_t psn = pkt.hdr.bth.psn;
  const uint64_t offset = uint64_t(psn_diff(psn, w.first_psn)) * qp.mtu;
  const uint64_t expect = psn == w.last_psn() ? w.length - offset : qp.mtu;
  if (pkt.payload.size() == expect) return offset;
  bump(t.counters().rcvd_malformed);  // wrong size for its PSN: drop, the timer recovers
  return UINT64_MAX;
}

// Selective mode: `upto` and every PSN before it are known executed at the responder — a
// cumulative ACK named it, or a READ response for the PSN after it came (responses and ACKs
// leave the responder in PSN order; it executes no READ beyond a gap) — while a READ before
// it is unanswered: its missing responses were lost, not late. Asks for those alone
// (requester::ask_read_responses), from where the last such request ended
// (CompleterState::read_gap_end) on, and remembers that SEND/WRITEs up to `upto` are
// acknowledged (acked_beyond) for when the READs before them complete. False, for go-back-N,
// outside selective mode or when an atomic lies unanswered before `upto` (its result is
// asked for by a go-back).
bool ask_for_unanswered(QueuePair& qp, Transport& t, uint32_t upto) {
  if (!t.selective_retransmit()) return false;
  for (uint64_t idx = qp.sq_base; idx < qp.sq_end(); ++idx) {
    const SendWqe& w = qp.wqe(idx);
    if (!w.started || psn_diff(w.first_psn, upto) > 0) break;
    if (w.info().cls == WrClass::kAtomic) return false;
  }
  uint32_t from = qp.comp.psn;
  if (qp.comp.read_gap_end != kNoPsn && psn_diff(qp.comp.read_gap_end, from) > 0)
    from = qp.comp.read_gap_end;
  const uint32_t end = psn_add(upto, 1);
  if (psn_diff(end, from) > 0 &&
      (qp.comp.recovery_psn == kNoPsn || psn_diff(from, qp.comp.recovery_psn) >= 0)) {
    // Lost responses are a loss like a selective NAK's range, judged the same way (once per
    // recovery episode): without it the window grew on, and each READ request drew its chunk
    // of responses into a full queue (bench/wan_bench.sh WAN_OP=read, 0 % loss: the
    // responder's emulated queue dropped 19,284 of 59,263 packets).
    judge_loss(qp, t, uint32_t(psn_diff(end, from)));
    if (qp.req.recovery == Recovery::kNone || qp.req.recovery == Recovery::kProbe)
      requester::enter_recovery(qp, Recovery::kSelective, "READ responses missing");
  }
  for (uint64_t idx = qp.sq_base; idx < qp.sq_end() && psn_diff(end, from) > 0; ++idx) {
    const SendWqe& w = qp.wqe(idx);
    if (!w.started || psn_diff(w.first_psn, upto) > 0) break;
    if (w.info().cls != WrClass::kRead || psn_diff(w.last_psn(), from) < 0) continue;
    const uint32_t first = psn_diff(w.first_psn, from) > 0 ? w.first_psn : from;
    const uint32_t stop = psn_diff(w.last_psn(), upto) < 0 ? psn_add(w.last_psn(), 1) : end;
    log().debug("qp {:#x}: psn {:#x} executed, READ unanswered from {:#x}: asking for {:#x}…{:#x}",
                qp.qpn(), upto, qp.comp.psn, first, psn_add(stop, wire::kPsnMask));
    requester::ask_read_responses(qp, t, first, stop);
  }
  raise_mark(qp.comp.read_gap_end, end);
  raise_mark(qp.comp.acked_beyond, upto);
  return true;
}

// Selective mode (Transport::selective_retransmit): a READ response ahead of the oldest
// unanswered PSN is placed now, and only what is missing before it is asked for again
// (ask_for_unanswered), where go-back-N re-requested everything from the gap on — IRN's
// out-of-order READ responses (Mittal et al., SIGCOMM 2018, 3.2 and 3.4: the requester
// places them and asks for the lost ones by a READ for their range). A second copy of a
// placed response that differs from it is contested, as the responder contests WRITEs
// (responder.cpp contest()): which one is forged cannot be told, so that response is asked
// for again. Returns false when the response is left to the in-order path (go-back-N).
bool read_response_ahead(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t psn = pkt.hdr.bth.psn;
  if (!t.selective_retransmit() || psn_diff(psn, qp.comp.psn) <= 0) return false;
  complete_acked(qp, t, psn_add(psn, wire::kPsnMask));  // SEND/WRITEs before the first READ
  if (qp.attr.state == QpState::kErr) return true;
  if (psn_diff(psn, qp.comp.psn) <= 0) return false;
  const uint64_t idx = requester::find_wqe(qp, psn);
  if (idx == qp.sq_end() || qp.wqe(idx).info().cls != WrClass::kRead) return false;
  SendWqe& w = qp.wqe(idx);
  const uint64_t offset = read_response_offset(qp, w, pkt, t);
  if (offset == UINT64_MAX) return true;
  if (w.read_placed_at(psn)) {
    bump(t.counters().rcvd_stale_response);
    if (!holds(w, offset, pkt.payload)) {
      bump(t.counters().ooo_contested);
      w.mark_read_placed(psn, false);
      --qp.comp.read_ahead;
      requester::ask_read_responses(qp, t, psn, psn_add(psn, 1));
    }
    return true;
  }
  if (!ask_for_unanswered(qp, t, psn_add(psn, wire::kPsnMask))) return false;
  if (!scatter(w, offset, pkt.payload)) {
    fail_local_buffer(qp, t);
    return true;
  }
  w.mark_read_placed(psn, true);
  ++qp.comp.read_ahead;
  if (psn == qp.req.timed_psn) {
    // The timed request's first response came (placed ahead): its round trip, now — not
    // when the repair of an earlier gap lets the oldest PSN pass it, which added that
    // repair's round trips to the sample (and to the pacing that divides by SRTT).
    qp.req.window.on_rtt_sample(t.now_ns() - qp.req.timed_ns);
    qp.req.timed_psn = kNoPsn;
  }
  bump(t.counters().ooo_read_responses);
  raise_mark(qp.comp.read_gap_end, psn_add(psn, 1));
  count_delivered(qp, t, 0);
  return true;
}

// After the oldest unanswered PSN has moved: moves on past READ responses placed out of order
// and SEND/WRITEs acknowledged while a READ before them was unanswered (acked_beyond),
// completing each WQE it passes the end of, in order.
void pass_answered(QueuePair& qp) {
  while (!qp.sq.empty()) {
    SendWqe& w = qp.sq.front();
    if (!w.started || psn_diff(qp.comp.psn, w.first_psn) < 0) break;
    if (w.info().cls == WrClass::kRead) {
      if (!w.read_placed_at(qp.comp.psn)) break;
      const bool last = qp.comp.psn == w.last_psn();
      qp.comp.psn = psn_add(qp.comp.psn, 1);
      --qp.comp.read_ahead;  // counted delivered when it was placed
      if (last) qp.retire_send(WcStatus::kSuccess, static_cast<uint32_t>(w.length));
      continue;
    }
    const uint32_t acked = qp.comp.acked_beyond;
    if (w.info().read_or_atomic || acked == kNoPsn || psn_diff(acked, qp.comp.psn) < 0) break;
    if (psn_diff(acked, w.last_psn()) < 0) {
      qp.comp.psn = psn_add(acked, 1);  // part of a multi-packet message
      break;
    }
    qp.comp.psn = psn_add(w.last_psn(), 1);
    qp.retire_send(WcStatus::kSuccess, static_cast<uint32_t>(w.length));
  }
}

void on_read_response(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  if (read_response_ahead(qp, pkt, t)) return;
  SendWqe* w = answered_wqe(qp, pkt, t, WrClass::kRead);
  if (!w) return;
  const uint32_t psn = pkt.hdr.bth.psn;
  const uint64_t offset = read_response_offset(qp, *w, pkt, t);
  if (offset == UINT64_MAX) return;
  if (!scatter(*w, offset, pkt.payload)) return fail_local_buffer(qp, t);
  qp.comp.psn = psn_add(psn, 1);
  if (psn == w->last_psn()) qp.retire_send(WcStatus::kSuccess, static_cast<uint32_t>(w->length));
  pass_answered(qp);
  note_progress(qp, t, psn);
}

void on_atomic_ack(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  SendWqe* w = answered_wqe(qp, pkt, t, WrClass::kAtomic);
  if (!w) return;
  const uint64_t orig = pkt.hdr.atomic_ack.orig;
  uint8_t bytes[8];
  std::memcpy(bytes, &orig, sizeof bytes);  // host order, as the CPU would read it
  if (!scatter(*w, 0, bytes)) return fail_local_buffer(qp, t);
  qp.comp.psn = psn_add(pkt.hdr.bth.psn, 1);
  note_progress(qp, t, pkt.hdr.bth.psn);
  qp.retire_send(WcStatus::kSuccess, 8);
}

}  // namespace

void on_response(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t psn = pkt.hdr.bth.psn;
  // Only PSNs that were sent and are not yet acknowledged mean anything; a positive ACK
  // for comp.psn − 1 is a harmless duplicate. A NAK or RNR NAK for comp.psn − 1 is not:
  // it names a request already known to be executed (no responder sends one; a duplicated
  // or forged packet does), and acting on it would fail the QP or rewind the requester to
  // a PSN the responder has executed, so the next message would be taken for a duplicate
  // and silently lost while completing successfully.
  // Opcodes compared by operation: an XRC initiator gets XRC_ACKNOWLEDGE (annex A14).
  const bool is_ack = wire::operation_of(pkt.hdr.bth.opcode) == wire::Opcode::kAcknowledge;
  const bool positive_ack = is_ack && wire::aeth_kind(pkt.hdr.aeth.syndrome) == wire::AckKind::kAck;
  if (psn_diff(psn, qp.req.max_psn) >= 0 || psn_diff(psn, qp.comp.psn) < -1 ||
      (psn_diff(psn, qp.comp.psn) == -1 && !positive_ack)) {
    bump(t.counters().rcvd_stale_response);
    return;
  }
  const uint32_t mask = pkt.info->mask;
  if (is_ack)
    on_ack(qp, pkt, t);
  else if (mask & wire::kIsRead)
    on_read_response(qp, pkt, t);
  else if (mask & wire::kHasAtomicAckEth)
    on_atomic_ack(qp, pkt, t);
  if (qp.attr.state == QpState::kErr) return;
  // The retransmit timer stays armed even when nothing is outstanding: on_timer clears
  // it lazily, so a steady stream of messages never re-arms it (and never wakes the
  // progress thread to do so).
  requester::run(qp, t);
}

uint64_t probe_timeout_ns(const QueuePair& qp) {
  const uint64_t srtt = qp.req.window.srtt_ns();
  const uint64_t rto = qp.retransmit_timeout_ns();
  if (!srtt || !rto) return 0;
  // Two round trips (RFC 8985 7.2), but at most half the retransmit timeout: a queue that
  // doubles the round trip brought 2 SRTT up to the timeout itself (a 134 ms timeout on a
  // 20 ms path), and a probe sent with the timeout recovers nothing before it.
  const uint64_t pto = std::max<uint64_t>(10'000'000, std::min(2 * srtt, rto / 2));
  return pto < rto ? pto : 0;
}

uint64_t resend_check_ns(const QueuePair& qp) {
  const uint64_t srtt = qp.req.window.srtt_ns();
  return srtt ? std::max<uint64_t>(1'000'000, srtt + srtt / 2) : 0;
}

void on_cnp(QueuePair& qp, Transport& t) {
  bump(t.counters().cnp_rcvd);
  if (!qp.req.cc_on) return;  // counted only: this device does not pace (SOFTRDMA_CC=none)
  const uint64_t cuts = qp.req.rate.cuts();
  qp.req.rate.set_min_rtt(qp.req.window.min_rtt_ns());
  qp.req.rate.on_cnp(t.now_ns(), qp.req.window.delivery_rate() * qp.mtu);
  if (qp.req.rate.cuts() != cuts) {
    bump(t.counters().dcqcn_rate_cuts);
    log().debug("qp {:#x}: CNP, rate {:.1f} Mbit/s (target {:.1f}, alpha {:.3f})", qp.qpn(),
                qp.req.rate.rate() * 8e3, qp.req.rate.target() * 8e3, qp.req.rate.alpha());
  }
  qp.req.window.on_congestion_notified();
}

namespace {

// Selective mode: the oldest unacknowledged PSN, with no ACK moving past it for
// resend_check_ns() since it was last resent (never resent: since it became the oldest), is
// sent (again): its resend was lost, or the selective NAK naming it was (the responder
// reports each gap once).
// No go-back-N and no window collapse, unlike the retransmit timeout (IRN's RTO_low plays
// this part, Mittal et al. 2018, 3.1). Only the head: the cumulative ACK stuck there says
// the responder still misses it, while a resent PSN beyond it may have been placed out of
// order — the ACK cannot tell, and resending all of those fed the queue that dropped them
// (measured: as many resends again as tail drops at 0 % loss). When the ACK moves on, the
// next head is judged in its turn.
// The resend check, READs: the oldest READ request resent for a selective NAK
// (requester::resend) whose first response has not come resend_check_ns after it was sent
// was lost again — a responder in selective mode defers every later READ behind it, so
// nothing else reveals it — and is sent once more, as the oldest SEND/WRITE resend is. Only
// the oldest: the responder reports the deferred ones again once it has it.
void resend_unanswered_read(QueuePair& qp, Transport& t, uint64_t now, uint64_t check) {
  uint32_t psn = kNoPsn;  // the oldest resent READ PSN whose response has not come
  for (const CompleterState::Resent& r : qp.comp.resent) {
    if (psn_diff(r.psn, qp.comp.psn) < 0 || (psn != kNoPsn && psn_diff(r.psn, psn) >= 0)) continue;
    const uint64_t idx = requester::find_wqe(qp, r.psn);
    if (idx != qp.sq_end() && qp.wqe(idx).info().cls == WrClass::kRead &&
        !qp.wqe(idx).read_placed_at(r.psn))
      psn = r.psn;
  }
  uint64_t sent_ns = 0;  // its latest resend
  for (const CompleterState::Resent& r : qp.comp.resent)
    if (r.psn == psn) sent_ns = std::max(sent_ns, r.sent_ns);
  if (psn == kNoPsn || now < sent_ns + check) return;
  log().debug("qp {:#x}: READ request psn {:#x} unanswered {} us after it was resent: again",
              qp.qpn(), psn, (now - sent_ns) / 1000);
  bump(t.counters().resend_again_pkts);
  requester::resend(qp, t, psn, /*ack_req=*/true);  // records it: watched again
}

void check_resends(QueuePair& qp, Transport& t, uint64_t now) {
  qp.comp.resend_check_ns = 0;
  const uint64_t check = resend_check_ns(qp);
  auto& resent = qp.comp.resent;
  std::erase_if(resent,
                [&](const CompleterState::Resent& r) { return psn_diff(r.psn, qp.comp.psn) < 0; });
  const bool outstanding =
      psn_diff(qp.req.psn, qp.comp.psn) > 0 && !qp.sq.empty() && qp.sq.front().started;
  if (!check || !outstanding || qp.req.rnr_wait()) return;
  // A READ or atomic at the head is not resent whole: its request draws a duplicate READ's
  // whole chunk of responses each time (measured: retry_cnt exhausted under periodic loss).
  // Missing READ responses asked for (requester::ask_read_responses) are asked for once
  // more when none came for resend_check_ns after that request: it or its responses were
  // lost too; a READ request resent for a selective NAK likewise (resend_unanswered_read).
  // Otherwise its own recovery (a response or ACK beyond it, the probe, the retransmit
  // timer).
  if (qp.sq.front().info().read_or_atomic) {
    auto& asks = qp.comp.read_asks;
    const uint32_t head = qp.comp.psn;
    std::erase_if(asks,
                  [head](const CompleterState::ReadAsk& a) { return psn_diff(a.end, head) <= 0; });
    const bool asked =
        t.selective_retransmit() && qp.sq.front().info().cls == WrClass::kRead && !asks.empty();
    if (!asked && !qp.comp.peer_selective) return;
    if (t.selective_retransmit()) resend_unanswered_read(qp, t, now, check);
    if (asked) {
      // Each request is watched on its own: a later one does not postpone an earlier one's
      // repeat (one deadline for all kept the head waiting behind a stream of new requests
      // until the retransmit timer fired: bench/wan_bench.sh WAN_OP=read at 1 % loss).
      std::vector<CompleterState::ReadAsk> due;
      for (const CompleterState::ReadAsk& a : asks)
        if (now >= a.sent_ns + check) due.push_back(a);
      std::erase_if(asks,
                    [&](const CompleterState::ReadAsk& a) { return now >= a.sent_ns + check; });
      for (const CompleterState::ReadAsk& a : due) {
        const uint32_t from = psn_diff(a.first, head) > 0 ? a.first : head;
        // Watched again; nothing is sent when all of them came meanwhile.
        if (requester::ask_read_responses(qp, t, from, a.end) == 0) continue;
        log().debug(
            "qp {:#x}: READ responses {:#x}…{:#x} missing {} us after they were asked "
            "for: again",
            qp.qpn(), from, psn_add(a.end, wire::kPsnMask), (now - a.sent_ns) / 1000);
        bump(t.counters().resend_again_pkts);
      }
      uint64_t next = UINT64_MAX;
      for (const CompleterState::ReadAsk& a : asks) next = std::min(next, a.sent_ns + check);
      if (next != UINT64_MAX && (!qp.comp.resend_check_ns || next < qp.comp.resend_check_ns)) {
        qp.comp.resend_check_ns = std::max(now + 1, next);
        t.timer_armed(qp, qp.comp.resend_check_ns);
      }
    }
    if (!qp.comp.resend_check_ns) {
      qp.comp.resend_check_ns = now + check;
      t.timer_armed(qp, qp.comp.resend_check_ns);
    }
    return;
  }
  if (!qp.comp.peer_selective) return;
  // A resent head is timed from its latest resend alone: the ACK that made it the oldest
  // already said the responder lacks it, and waiting 1.5 SRTT more from that moment kept a
  // resend lost behind other holes up to ~3 SRTT at the head (100 Gbit/s x 50 ms at 0.1 %
  // loss: stalls of 1-2 round trips, docs/wide-area.md). A head never resent is timed from
  // when it became the oldest (its NAK may have been lost).
  const CompleterState::Resent* r = last_resend(qp, qp.comp.psn);
  uint64_t last = r ? r->sent_ns : qp.comp.head_since_ns;
  if (now >= last + check) {
    log().debug(
        "qp {:#x}: psn {:#x} unacknowledged {} us after it was last resent or became the "
        "oldest: again",
        qp.qpn(), qp.comp.psn, (now - last) / 1000);
    resend_head_again(qp, t);
    last = now;
  }
  qp.comp.resend_check_ns = std::max(now + 1, last + check);
  t.timer_armed(qp, qp.comp.resend_check_ns);
}

// The tail-loss probe's check (probe_timeout_ns): lazy like the retransmit timer — armed at
// a transmission, moved on to the last transmission or ACK progress plus the timeout, and
// fired only when neither happened for that long. One probe per stall (probe_sent, cleared
// by ACK progress); an RNR wait or nothing outstanding disarms it.
void check_tail(QueuePair& qp, Transport& t, uint64_t now) {
  qp.comp.probe_ns = 0;
  const uint64_t pto = probe_timeout_ns(qp);
  const bool outstanding =
      psn_diff(qp.req.psn, qp.comp.psn) > 0 && !qp.sq.empty() && qp.sq.front().started;
  if (!pto || !outstanding || qp.req.rnr_wait() || qp.comp.probe_sent ||
      qp.attr.state != QpState::kRts)
    return;
  const uint64_t since = std::max(qp.comp.last_progress_ns, qp.comp.last_delivery_ns);
  if (now < since + pto) {
    qp.comp.probe_ns = since + pto;
    t.timer_armed(qp, qp.comp.probe_ns);
    return;
  }
  // The retransmit timeout is due as well (a progress thread that ran late): it recovers.
  if (now >= qp.comp.last_progress_ns + qp.retransmit_timeout_ns()) return;
  qp.comp.probe_sent = requester::probe(qp, t);
}

}  // namespace

void on_timer(QueuePair& qp, Transport& t, uint64_t now) {
  if (qp.comp.rnr_ns && now >= qp.comp.rnr_ns) {
    qp.comp.rnr_ns = 0;
    requester::enter_recovery(qp, Recovery::kGoBackN, "RNR timer expired");
    requester::run(qp, t);
  }
  if (qp.comp.resend_check_ns && now >= qp.comp.resend_check_ns) check_resends(qp, t, now);
  if (qp.comp.probe_ns && now >= qp.comp.probe_ns) check_tail(qp, t, now);
  if (qp.comp.pace_ns && now >= qp.comp.pace_ns) {
    qp.comp.pace_ns = 0;
    requester::run(qp, t);
  }
  if (!qp.comp.timer_ns || now < qp.comp.timer_ns) return;
  const bool outstanding =
      psn_diff(qp.req.max_psn, qp.comp.psn) > 0 && !qp.sq.empty() && qp.sq.front().started;
  if (!outstanding || qp.req.rnr_wait()) {
    qp.comp.timer_ns = 0;
    return;
  }
  const uint64_t rto = qp.retransmit_timeout_ns();
  if (now < qp.comp.last_progress_ns + rto) {
    qp.comp.timer_ns = qp.comp.last_progress_ns + rto;  // lazy timer: progress since armed
    return;
  }
  bump(t.counters().retransmit_timeouts);
  qp.comp.timer_ns = 0;
  const bool counts = timeout_counts(qp, t, now);
  if (qp.attr.state == QpState::kErr || (counts && !retry_budget(qp, t))) return;
  qp.comp.fast_retry_psn = kNoPsn;
  qp.comp.recovery_psn = kNoPsn;
  qp.req.window.on_timeout();
  retry_from(qp, qp.comp.psn, "timeout");
  requester::run(qp, t);
  if (qp.attr.state == QpState::kErr || qp.comp.timer_ns) return;
  // Nothing went out (the path to the peer is paused: its same-host backlog is full, and a
  // dead or stopped peer never empties it): the next timeout must still come, or a
  // requester parked on a dead peer waits forever.
  qp.comp.timer_ns = now + rto;
  t.timer_armed(qp, qp.comp.timer_ns);
}

}  // namespace softrdma::engine::completer
