// Responder: executes SEND/WRITE/READ/ATOMIC requests, sends ACK/NAK, read responses and
// atomic ACKs, replays duplicates (IBTA vol 1, 9.7.4 and 9.7.5.1; rxe_resp.c).
#include <atomic>
#include <cstring>
#include <iterator>

#include "engine/cq.h"
#include "engine/log.h"
#include "engine/memory.h"
#include "engine/placement.h"
#include "engine/qp.h"
#include "engine/srq.h"
#include "engine/xrcd.h"
#include "net/fault_guard.h"
#include "wire/icrc.h"

namespace softrdma::engine::responder {

namespace {

using wire::Opcode;
using wire::psn_add;
using wire::psn_diff;

/// How many executed READs/atomics are kept for duplicate replay, at least.
constexpr size_t kMinResources = 16;

uint8_t opcode(const QueuePair& qp, Opcode op);

// Sends a ready response now, or behind the READ responses still owed (PSN order).
void send_control(QueuePair& qp, Transport& t, const wire::Headers& h) {
  if (qp.resp.pending.empty())
    t.transmit(h, qp.remote_ip, {}, 0);
  else
    qp.resp.pending.push_back({.read = false, .control = h});
}

void send_ack(QueuePair& qp, Transport& t, uint8_t syndrome, uint32_t psn) {
  wire::Headers h;
  h.bth.opcode = opcode(qp, Opcode::kAcknowledge);
  h.bth.dest_qpn = qp.attr.dest_qp_num;
  h.bth.psn = psn;
  h.aeth.syndrome = syndrome;
  h.aeth.msn = qp.resp.msn;
  send_control(qp, t, h);
  if (wire::aeth_kind(syndrome) == wire::AckKind::kAck)
    bump(t.counters().ack_sent);
  else if (wire::aeth_kind(syndrome) == wire::AckKind::kNak)
    bump(t.counters().send_nak);
}

void nak(QueuePair& qp, Transport& t, wire::NakCode code, uint32_t psn) {
  log().debug("qp {:#x}: NAK code {} psn {:#x}", qp.qpn(), int(code), psn);
  qp.resp.ack_pending = false;  // a NAK implicitly acknowledges every earlier PSN
  send_ack(qp, t, wire::aeth_nak(code), psn);
}

// Class C/D errors (IBTA 9.9.3): NAK the request, then the QP goes to ERR.
void nak_and_fail(QueuePair& qp, Transport& t, wire::NakCode code, uint32_t psn) {
  // The QP is failing: READ responses it still owed are not sent, the NAK goes now.
  qp.resp.pending.clear();
  nak(qp, t, code, psn);
  qp.enter_error(WcStatus::kWrFlushErr);
}

void rnr_nak(QueuePair& qp, Transport& t, uint32_t psn) {
  qp.resp.ack_pending = false;
  // Packets already in flight behind this one are dropped silently: the requester comes
  // back to `psn` after its RNR back-off, so a sequence NAK would only cost it a retry.
  qp.resp.nak_sent = true;
  qp.resp.ooo_max_psn = psn;
  bump(t.counters().send_rnr_err);
  send_ack(qp, t, wire::aeth_rnr_nak(qp.attr.min_rnr_timer), psn);
}

void ack_later(QueuePair& qp, uint32_t psn) {
  qp.resp.ack_pending = true;
  qp.resp.ack_psn = psn;
}

using placement::check_remote;
using placement::Outcome;

uint32_t read_psns(const QueuePair& qp, uint64_t dma_length) {
  return placement::message_psns(qp, dma_length);
}

// The opcode of RC operation `op` in the QP's service (an XRC target answers with XRC
// ACKs and read responses, annex A14).
uint8_t opcode(const QueuePair& qp, Opcode op) {
  return qp.type_info().opcode(op);
}

// Response `i` of READ `r`, whose memory starts at `src`.
// `h` is the caller's, reused across a burst (a fresh Headers per packet was zero-filled with
// `rep stos`, 100 bytes, on the responder's hot path); every field a response carries is set
// here.
void send_read_response(QueuePair& qp, Transport& t, const PendingResponse& r, const uint8_t* src,
                        uint32_t i, wire::Headers& h) {
  const uint64_t off = uint64_t(i) * qp.mtu;
  const uint32_t pay = static_cast<uint32_t>(std::min<uint64_t>(qp.mtu, r.length - off));
  const uint32_t n = r.packets;
  Opcode op = n == 1       ? Opcode::kReadResponseOnly
              : i == 0     ? Opcode::kReadResponseFirst
              : i == n - 1 ? Opcode::kReadResponseLast
                           : Opcode::kReadResponseMiddle;
  h.bth.opcode = opcode(qp, op);
  h.bth.dest_qpn = qp.attr.dest_qp_num;
  h.bth.psn = psn_add(r.psn, i);
  h.aeth.syndrome = wire::aeth_ack();
  h.aeth.msn = r.msn;
  iovec v{const_cast<uint8_t*>(src) + off, pay};
  t.transmit(h, qp.remote_ip, std::span<const iovec>(&v, pay ? 1 : 0), pay);
}

// Owes the responses of a READ of `len` bytes at rkey/va starting at PSN `psn`, and sends
// what the path has room for now (resume()).
void send_read_responses(QueuePair& qp, Transport& t, uint32_t psn, uint32_t rkey, uint64_t va,
                         uint64_t len) {
  qp.resp.pending.push_back(
      {.read = true,
       .psn = psn,
       .msn = qp.resp.msn,
       .rkey = rkey,
       .va = va,
       .length = len,
       .packets = len == 0 ? 1 : static_cast<uint32_t>((len + qp.mtu - 1) / qp.mtu)});
  if (qp.resp.pending.size() == 1) resume(qp, t);
}

void send_atomic_ack(QueuePair& qp, Transport& t, uint32_t psn, uint64_t orig) {
  wire::Headers h;
  h.bth.opcode = opcode(qp, Opcode::kAtomicAcknowledge);
  h.bth.dest_qpn = qp.attr.dest_qp_num;
  h.bth.psn = psn;
  h.aeth.syndrome = wire::aeth_ack();
  h.aeth.msn = qp.resp.msn;
  h.atomic_ack.orig = orig;
  send_control(qp, t, h);
  bump(t.counters().ack_sent);
}

// PSN against the expected one (IBTA 9.7.5.1.2, 9.7.5.1.3; rxe check_psn).
RequestCheck check_psn(const QueuePair& qp, const wire::Packet& pkt) {
  const int32_t d = psn_diff(pkt.hdr.bth.psn, qp.resp.epsn);
  return d > 0   ? RequestCheck::kOutOfSequence
         : d < 0 ? RequestCheck::kDuplicate
                 : RequestCheck::kNew;
}

// Opcode against the message in progress (IBTA 9.7.4.1.3 opcode sequence; rxe check_op_seq).
RequestCheck check_op_sequence(const QueuePair& qp, const wire::Packet& pkt) {
  const uint32_t m = pkt.info->mask;
  const bool starts = m & (wire::kIsFirst | wire::kIsOnly);
  bool in_own = false, in_other = qp.resp.in_send || qp.resp.in_write;
  if (m & wire::kIsSend) {
    in_own = qp.resp.in_send;
    in_other = qp.resp.in_write;
  } else if (m & wire::kIsWrite) {
    in_own = qp.resp.in_write;
    in_other = qp.resp.in_send;
  }
  if (in_other || (starts && in_own)) return RequestCheck::kMissingLast;
  if (!starts && !in_own) return RequestCheck::kMissingFirst;
  return RequestCheck::kNew;
}

// Payload size against the path MTU: first/middle packets carry exactly one MTU, last/only
// at most one (IBTA 9.7.4.1.4; rxe check_length).
RequestCheck check_length(const QueuePair& qp, const wire::Packet& pkt) {
  const uint32_t m = pkt.info->mask;
  if (!(m & wire::kHasPayload)) return RequestCheck::kNew;
  if (pkt.payload.size() > qp.mtu) return RequestCheck::kBadLength;
  if ((m & (wire::kIsFirst | wire::kIsMiddle)) && pkt.payload.size() != qp.mtu)
    return RequestCheck::kBadLength;
  return RequestCheck::kNew;
}

void on_send(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t psn = pkt.hdr.bth.psn;
  switch (placement::send(qp, pkt, t)) {
    case Outcome::kDone:
      break;
    case Outcome::kNoRecvWqe:
      return rnr_nak(qp, t, psn);
    case Outcome::kLength:
      qp.complete_recv(WcStatus::kLocLenErr, WcOpcode::kRecv, 0, 0, 0, false);
      return nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, psn);
    case Outcome::kProtection:
      qp.complete_recv(WcStatus::kLocProtErr, WcOpcode::kRecv, 0, 0, 0, false);
      return nak_and_fail(qp, t, wire::NakCode::kRemoteOperationalError, psn);
    case Outcome::kInvalidate:  // rxe: the receive completes in error, the request is refused
      qp.complete_recv(WcStatus::kRemInvReqErr, WcOpcode::kRecv, 0, 0, 0, false);
      return nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, psn);
    case Outcome::kAccess:
    case Outcome::kInvalid:
      return nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, psn);
  }
  qp.resp.epsn = psn_add(psn, 1);
  if (pkt.hdr.bth.ack_req) ack_later(qp, psn);
}

void on_write(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t psn = pkt.hdr.bth.psn;
  switch (placement::write(qp, pkt, t)) {
    case Outcome::kDone:
      break;
    case Outcome::kNoRecvWqe:
      return rnr_nak(qp, t, psn);
    case Outcome::kAccess:
      return nak_and_fail(qp, t, wire::NakCode::kRemoteAccessError, psn);
    case Outcome::kLength:
    case Outcome::kProtection:
    case Outcome::kInvalid:
    case Outcome::kInvalidate:
      return nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, psn);
  }
  qp.resp.epsn = psn_add(psn, 1);
  if (pkt.hdr.bth.ack_req) ack_later(qp, psn);
}

// Remembers an executed READ/ATOMIC for duplicate replay (bounded, oldest dropped).
void remember(QueuePair& qp, const ResponderResource& r) {
  auto& res = qp.resp.resources;
  res.push_back(r);
  while (res.size() > std::max<size_t>(kMinResources, qp.attr.max_dest_rd_atomic)) res.pop_front();
}

void on_read(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const wire::Reth& r = pkt.hdr.reth;
  const uint32_t psn = pkt.hdr.bth.psn;
  const uint8_t* p = nullptr;
  if (r.dma_length) {
    p = check_remote(qp, t, r.rkey, r.va, r.dma_length, kRemoteRead);
    if (!p) return nak_and_fail(qp, t, wire::NakCode::kRemoteAccessError, psn);
    // The responses gather from this memory when they are sent: one read per page now
    // finds memory unmapped since registration while a NAK can still say so.
    if (!net::guarded_touch(p, r.dma_length)) {
      bump(t.counters().resp_access_faults);
      log().debug("qp {:#x}: READ psn {:#x} of unmapped memory", qp.qpn(), psn);
      return nak_and_fail(qp, t, wire::NakCode::kRemoteAccessError, psn);
    }
  }
  const uint32_t n = read_psns(qp, r.dma_length);
  remember(qp, {.read = true,
                .psn = psn,
                .last_psn = psn_add(psn, n - 1),
                .va = r.va,
                .rkey = r.rkey,
                .length = r.dma_length});
  flush_ack(qp, t);  // keep ACKs for earlier PSNs ahead of the responses
  send_read_responses(qp, t, psn, r.rkey, r.va, r.dma_length);
  qp.resp.msn = psn_add(qp.resp.msn, 1);
  qp.resp.epsn = psn_add(psn, n);
}

void on_atomic(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const wire::AtomicEth& a = pkt.hdr.atomic;
  const uint32_t psn = pkt.hdr.bth.psn;
  if (a.va & 7) return nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, psn);
  uint8_t* p = check_remote(qp, t, a.rkey, a.va, 8, kRemoteAtomic);
  if (!p) return nak_and_fail(qp, t, wire::NakCode::kRemoteAccessError, psn);
  // Atomic with respect to other RDMA atomics (all run under the device lock) and to
  // CPU atomics on the same word; under the fault guard (the word may have been unmapped).
  struct AtomicOp {
    uint64_t* word;
    bool cas;
    uint64_t compare, swap_add, orig;
  } op{reinterpret_cast<uint64_t*>(p),
       wire::operation_of(pkt.hdr.bth.opcode) == Opcode::kCompareSwap, a.compare, a.swap_add, 0};
  const bool done = net::guarded_call(
      [](void* v) {
        AtomicOp& o = *static_cast<AtomicOp*>(v);
        if (reinterpret_cast<uintptr_t>(o.word) & 7) {
          // The VA is aligned but the memory behind it is not (an MR registered with an
          // iova of another alignment, or a DM MR at an offset that is not a multiple of
          // 8): atomic with respect to other RDMA atomics (the device lock), not to CPU ones.
          uint64_t cur;
          std::memcpy(&cur, o.word, 8);
          o.orig = cur;
          if (!o.cas || cur == o.compare) {
            const uint64_t next = o.cas ? o.swap_add : cur + o.swap_add;
            std::memcpy(o.word, &next, 8);
          }
          return;
        }
        std::atomic_ref<uint64_t> word(*o.word);
        if (o.cas) {
          o.orig = o.compare;
          word.compare_exchange_strong(o.orig, o.swap_add);
        } else {
          o.orig = word.fetch_add(o.swap_add);
        }
      },
      &op);
  if (!done) {
    bump(t.counters().resp_access_faults);
    return nak_and_fail(qp, t, wire::NakCode::kRemoteAccessError, psn);
  }
  const uint64_t orig = op.orig;
  remember(qp, {.read = false, .psn = psn, .last_psn = psn, .atomic_orig = orig});
  qp.resp.msn = psn_add(qp.resp.msn, 1);
  flush_ack(qp, t);
  send_atomic_ack(qp, t, psn, orig);
  qp.resp.epsn = psn_add(psn, 1);
}

// RDMA ATOMIC WRITE (IBTA vol 1 rel. 1.5; rxe_resp.c's atomic_write_reply): the RETH names
// 8 bytes of remote memory, the payload holds the value. In rxe's order: a length other than
// 8 is an invalid request; R_Key, bounds and REMOTE_WRITE (the QP's and the MR's — rdma-core
// 44 has no access flag of its own for it) a remote access error; an address not 8-byte
// aligned an invalid request (rxe's RESPST_ERR_MISALIGNED_ATOMIC). All NAKed, the QP to ERR.
// The store is one 8-byte release store, under the fault guard; the ACK follows as for a
// WRITE. A duplicate is re-ACKed, never executed again (on_duplicate): with PSNs in order a
// PSN below the expected one was executed.
void on_atomic_write(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const wire::Reth& r = pkt.hdr.reth;
  const uint32_t psn = pkt.hdr.bth.psn;
  if (r.dma_length != wire::kAtomicWriteBytes || pkt.payload.size() != wire::kAtomicWriteBytes)
    return nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, psn);
  uint8_t* p = check_remote(qp, t, r.rkey, r.va, wire::kAtomicWriteBytes, kRemoteWrite);
  if (!p) return nak_and_fail(qp, t, wire::NakCode::kRemoteAccessError, psn);
  if (reinterpret_cast<uintptr_t>(p) & (wire::kAtomicWriteBytes - 1))
    return nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, psn);
  struct Store {
    uint64_t* word;
    uint64_t value;
  } op{reinterpret_cast<uint64_t*>(p), 0};
  std::memcpy(&op.value, pkt.payload.data(), sizeof op.value);  // the bytes as sent
  const bool done = net::guarded_call(
      [](void* v) {
        Store& o = *static_cast<Store*>(v);
        std::atomic_ref<uint64_t>(*o.word).store(o.value, std::memory_order_release);
      },
      &op);
  if (!done) {
    bump(t.counters().resp_access_faults);
    return nak_and_fail(qp, t, wire::NakCode::kRemoteAccessError, psn);
  }
  bump(t.counters().atomic_write_executed);
  qp.resp.msn = psn_add(qp.resp.msn, 1);
  qp.resp.epsn = psn_add(psn, 1);
  ack_later(qp, psn);  // AckReq is set: the requester completes the WQE on this ACK
}

// The record of the executed READ that a duplicate READ request re-asks for, or nullptr.
// A requester that goes back into the middle of a READ re-requests the rest of it: same
// rkey, start address advanced by whole MTUs in step with the PSN, and an end no further
// than the original's (IBTA 9.7.5.1.3.1).
const ResponderResource* find_read(const QueuePair& qp, const wire::Packet& pkt) {
  const uint32_t psn = pkt.hdr.bth.psn;
  const wire::Reth& r = pkt.hdr.reth;
  for (const ResponderResource& res : qp.resp.resources) {
    if (!res.read || psn_diff(psn, res.psn) < 0 || psn_diff(psn, res.last_psn) > 0) continue;
    const uint64_t skip = uint64_t(psn_diff(psn, res.psn)) * qp.mtu;
    if (r.rkey != res.rkey || r.va != res.va + skip || skip > res.length ||
        r.dma_length > res.length - skip)
      return nullptr;
    return &res;
  }
  return nullptr;
}

// A request whose PSN is behind the expected one (IBTA 9.7.5.1.3): SEND/WRITE and ATOMIC
// WRITE are re-acknowledged, READs re-served and atomics answered from the saved result — but only
// for requests this responder really executed. Anything else is dropped and counted; a
// duplicate never moves the QP to ERR (it may be forged: its PSN is not the expected one).
void on_duplicate(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  bump(t.counters().duplicate_request);
  const uint32_t m = pkt.info->mask;
  const uint32_t psn = pkt.hdr.bth.psn;
  if (m & wire::kIsRead) {
    const wire::Reth& r = pkt.hdr.reth;
    const uint8_t* p = nullptr;
    if (find_read(qp, pkt) &&
        (r.dma_length == 0 ||
         ((p = check_remote(qp, t, r.rkey, r.va, r.dma_length, kRemoteRead)) != nullptr &&
          net::guarded_touch(p, r.dma_length)))) {
      flush_ack(qp, t);
      send_read_responses(qp, t, psn, r.rkey, r.va, r.dma_length);
      return;
    }
    bump(t.counters().duplicate_dropped);
    log().debug("qp {:#x}: duplicate READ psn {:#x} matches no executed READ: dropped", qp.qpn(),
                psn);
    if (log().should_log(spdlog::level::debug))
      for (const ResponderResource& res : qp.resp.resources)
        log().debug("qp {:#x}:   kept: {} psn {:#x}…{:#x} va {:#x} len {} (asked va {:#x} len {})",
                    qp.qpn(), res.read ? "READ" : "atomic", res.psn, res.last_psn, res.va,
                    res.length, pkt.hdr.reth.va, pkt.hdr.reth.dma_length);
    return;
  }
  if (m & wire::kIsAtomic) {
    // Never execute twice: answer from the saved result (IBTA 9.7.5.1.3.2).
    for (const ResponderResource& r : qp.resp.resources) {
      if (!r.read && r.psn == psn) {
        flush_ack(qp, t);
        send_atomic_ack(qp, t, r.psn, r.atomic_orig);
        return;
      }
    }
    bump(t.counters().duplicate_dropped);
    log().debug("qp {:#x}: duplicate atomic psn {:#x} has no saved result: dropped", qp.qpn(), psn);
    return;
  }
  if (pkt.hdr.bth.ack_req)
    ack_later(qp, psn_add(qp.resp.epsn, wire::kPsnMask));  // everything before epsn is done
}

// A gap: NAK once with the expected PSN and drop until the requester goes back (IBTA
// 9.7.5.1.2 PSN sequence error).
void on_out_of_sequence(QueuePair& qp, uint32_t psn, Transport& t) {
  bump(t.counters().out_of_seq_request);
  // One NAK per gap (IBTA 9.7.5.1.2), until the expected PSN arrives; again only when
  // the requester has evidently gone back — a PSN strictly below the highest
  // out-of-sequence one seen since the NAK, i.e. the NAK was lost or the retransmission
  // lost the expected packet again. Repeats of one PSN (equal, not below) draw no NAK.
  if (!qp.resp.nak_sent || psn_diff(psn, qp.resp.ooo_max_psn) < 0) {
    log().debug("qp {:#x}: psn {:#x} out of sequence (expected {:#x}, highest seen {:#x})",
                qp.qpn(), psn, qp.resp.epsn, qp.resp.ooo_max_psn);
    qp.resp.nak_sent = true;
    qp.resp.ooo_max_psn = psn;
    nak(qp, t, wire::NakCode::kPsnSequenceError, qp.resp.epsn);
  } else if (psn_diff(psn, qp.resp.ooo_max_psn) > 0) {
    qp.resp.ooo_max_psn = psn;
  }
}

// ---- Selective retransmission (IRN, Mittal et al. 2018, 3.2) ---------------------------
// A requester whose requests carry Bth::selective gets, from a responder with
// SOFTRDMA_SELECTIVE_RETX on, this instead of go-back-N: packets beyond the expected PSN that
// carry their own placement are written to memory at once and remembered in ReceivedPsns;
// each gap is reported once by a selective NAK naming the missing range; when the expected
// PSN arrives, the responder steps over what it placed (MSN, WRITE state) and ACKs. SEND
// packets and the last packet of a WRITE with immediate need the in-order state (the receive
// WQE, a MIDDLE's offset in it): they are staged — a copy kept in ReceivedPsns, reported
// held like a placed packet — and executed as if just arrived when the expected PSN reaches
// them (stage_early); IRN (3.4) instead carries the receive WQE's sequence number and offset
// in an extension header so that a NIC without buffers can place them, which would take WQEs
// ahead of the expected PSN (impossible from an SRQ) and a header no other RoCE peer knows —
// a software responder has the memory to wait, bounded by ReceivedPsns::kMaxStagedBytes.
// READs and atomics must execute in order: dropped and reported missing like lost ones
// (resent once). Completions and every in-order effect keep the IBTA order.

void send_selective_nak(QueuePair& qp, Transport& t, uint32_t first, uint32_t last) {
  if (first == qp.resp.epsn) {
    // The gap at the expected PSN: acknowledge what came before it first (a selective NAK
    // acknowledges nothing, and coalesced ACKs may not have said it yet), so the
    // requester's oldest unacknowledged PSN is the missing one — what it watches to resend
    // a lost resend or the PSNs of a lost NAK (completer::resend_check_ns).
    qp.resp.ack_pending = false;
    send_ack(qp, t, wire::aeth_ack(), psn_add(first, wire::kPsnMask));
  }
  wire::Headers h;
  h.bth.opcode = opcode(qp, Opcode::kAcknowledge);
  h.bth.dest_qpn = qp.attr.dest_qp_num;
  h.bth.psn = first;
  h.aeth.syndrome = wire::aeth_nak(wire::NakCode::kSelectiveRetransmit);
  h.aeth.msn = last;  // the range's last PSN (see NakCode::kSelectiveRetransmit)
  t.transmit(h, qp.remote_ip, {}, 0);
  bump(t.counters().selective_nak_sent);
  qp.resp.ooo->mark_reported_range(first, last);
  log().debug("qp {:#x}: selective NAK {:#x}…{:#x} (expected {:#x})", qp.qpn(), first, last,
              qp.resp.epsn);
}

// A placed packet beyond a gap that asks for an ACK (AckReq: every kAckEvery packets and
// each message's last), from a requester that understands selective ACKs: tells it how many
// PSNs beyond the expected one this responder holds (NakCode::kSelectiveAck), so that it
// counts them out of its flight and goes on sending while the gap is repaired (IRN's SACK,
// Mittal et al. 2018, 3.2). It acknowledges nothing; a lost one is replaced by the next.
// To a requester that set Bth::sack_ranges it also lists the oldest runs not kept up to the
// highest PSN that has arrived (wire::SackReport), so the requester learns of a lost selective
// NAK or a lost resend at the next of these, not when the gap becomes its oldest PSN.
void send_selective_ack(QueuePair& qp, Transport& t, const ReceivedPsns& o) {
  wire::Headers h;
  h.bth.opcode = opcode(qp, Opcode::kAcknowledge);
  h.bth.dest_qpn = qp.attr.dest_qp_num;
  h.bth.psn = qp.resp.epsn;
  h.aeth.syndrome = wire::aeth_nak(wire::NakCode::kSelectiveAck);
  h.aeth.msn = std::min<uint32_t>(o.placed_count(), wire::kPsnMask);
  // Copied by transmit() (at most kTransmitCopyBytes): the stack may hold it.
  uint8_t bytes[wire::sack_report_bytes(wire::SackReport::kSackRangesMax)];
  uint32_t len = 0;
  if (qp.resp.peer_sack_ranges && o.next != qp.resp.epsn) {
    wire::SackReport r;
    r.highest = psn_add(o.next, wire::kPsnMask);
    o.missing_runs(qp.resp.epsn, wire::SackReport::kSackRangesMax,
                   [&](uint32_t first, uint32_t last) {
                     r.ranges[r.count++] = {first, last};
                   });
    len = uint32_t(wire::encode_sack_report(r, bytes));
  }
  const iovec v{bytes, len};
  t.transmit(h, qp.remote_ip, {&v, len ? 1u : 0u}, len);
  bump(t.counters().selective_ack_sent);
}

// A copy of a PSN placed out of order that asks for an ACK (AckReq: the last packet of a
// batch of resends) while the PSNs from the expected one up to the next placed PSN are
// missing: the requester resent what this responder holds, so it does not know what is
// missing — the selective NAK that named the gap, or the resends it drew, were lost (a full
// socket buffer drops NAKs too). Says it again, once per expected PSN: the ACK of what lies
// before the expected PSN, and the selective NAK of the run from it to the next placed PSN
// (counter selective_nak_repeated). Otherwise only the resend check found the missing
// PSNs, one per 1.5 SRTT, each ACK re-arming the retransmit timer (dapl dtest over UDP
// crawled ~6,000 PSNs at one per 5-10 ms, resending 2,383 placed packets each time). Only
// before a placed PSN, and once per expected PSN: a run of requests not kept early (SENDs
// were not, before they were staged; READ requests are not) comes back in order behind its
// report, and repeating that report at every duplicate had the whole run resent again and
// again (qperf rc_bw over UDP stalled, 8 runs in 25).
// Costs a forger replaying a packet at most one resend of PSNs that are really missing.
void report_gap_again(QueuePair& qp, Transport& t, ReceivedPsns& o) {
  const uint32_t epsn = qp.resp.epsn;
  if (qp.resp.gap_repeated_psn == epsn || psn_diff(o.next, epsn) <= 0 || o.placed(epsn)) return;
  const uint32_t end = o.first_placed(epsn, o.next);
  if (end == o.next) return;
  qp.resp.gap_repeated_psn = epsn;
  bump(t.counters().selective_nak_repeated);
  send_selective_nak(qp, t, epsn, psn_add(end, wire::kPsnMask));
}

// Writes a WRITE segment that arrived ahead of the expected PSN to its place, after the
// checks its in-order copy would pass (placement::write): length against the MTU, a FIRST's
// or ONLY's RETH — rkey, bounds, access — against its payload (a FIRST's DMA length exceeds
// its one MTU, an ONLY's equals its payload; a zero-length WRITE has nothing to place and
// no rkey to check, so it waits for its turn), a MIDDLE's or LAST's offset inside a WRITE
// whose FIRST passed them. False when it cannot be placed now (see above); nothing is
// written then.
bool place_early(QueuePair& qp, const wire::Packet& pkt, Transport& t, ReceivedPsns& o) {
  const uint32_t m = pkt.info->mask;
  const uint32_t psn = pkt.hdr.bth.psn;
  if (!(m & wire::kIsWrite) || (m & wire::kConsumesRecvWqe)) return false;
  if (check_length(qp, pkt) != RequestCheck::kNew) return false;
  const size_t n = pkt.payload.size();
  if (m & wire::kHasReth) {
    const wire::Reth& r = pkt.hdr.reth;
    if (r.dma_length == 0) return false;
    if ((m & wire::kIsOnly) && n != r.dma_length) return false;
    if ((m & wire::kIsFirst) && r.dma_length <= n) return false;
    // A FIRST whose WRITE cannot be remembered is not placed: its later packets could not
    // find it, and stepping over it in order would leave the responder outside the WRITE
    // (a MIDDLE refused as "missing first packet": the QP in error for a lossy link).
    if ((m & wire::kIsFirst) && !o.write_room()) return false;
    uint8_t* p = check_remote(qp, t, r.rkey, r.va, r.dma_length, kRemoteWrite);
    if (!p) return false;  // the in-order copy draws the access error
    if (!pkt.hdr.bth.placed && !net::guarded_copy(p, pkt.payload.data(), n))
      return false;  // in order: NAK
    if (m & wire::kIsFirst)
      o.add_write({psn, p, r.dma_length, read_psns(qp, r.dma_length), r.rkey, r.va});
    return true;
  }
  const WritePlacement* w = o.write_holding(psn);
  if (!w || psn == w->first_psn || (!w->base && !pkt.hdr.bth.placed)) return false;
  const uint64_t off = uint64_t(psn_diff(psn, w->first_psn)) * qp.mtu;
  const bool ends = m & wire::kIsLast;
  if (off + n > w->length || ends != (off + n == w->length)) return false;
  if (pkt.hdr.bth.placed) return true;
  // Checked again: the region may have been deregistered since the FIRST.
  uint8_t* p = check_remote(qp, t, w->rkey, w->va + off, n, kRemoteWrite);
  return p && net::guarded_copy(p, pkt.payload.data(), n);
}

// Keeps a SEND packet or a WRITE-with-immediate LAST/ONLY that arrived ahead of the expected
// PSN, to execute when that PSN reaches it (ReceivedPsns::stage): its in-order checks (PSN,
// opcode sequence, receive WQE, lengths, keys) all run then; only the MTU is checked now.
// False when it is not such a packet, or the staged bytes are at their cap (it is then
// resent, as a go-back-N responder would have it).
bool stage_early(QueuePair& qp, const wire::Packet& pkt, ReceivedPsns& o) {
  const uint32_t m = pkt.info->mask;
  if (!(m & (wire::kIsSend | wire::kConsumesRecvWqe))) return false;
  if (check_length(qp, pkt) != RequestCheck::kNew) return false;
  return o.stage(pkt.hdr.bth.psn, pkt);
}

// PSNs a request uses: a READ its responses', everything else one.
uint32_t request_psns(const QueuePair& qp, const wire::Packet& pkt) {
  return (pkt.info->mask & wire::kIsRead) ? read_psns(qp, pkt.hdr.reth.dma_length) : 1u;
}

// What tells two copies of a PSN apart: CRC-32 of the opcode, the RETH and the payload.
// A genuine resend is the same bytes (the requester resends from the same WQE and memory).
uint32_t fingerprint(const wire::Packet& pkt) {
  uint8_t h[17] = {pkt.hdr.bth.opcode};
  if (pkt.info->mask & wire::kHasReth) {
    std::memcpy(h + 1, &pkt.hdr.reth.va, 8);
    std::memcpy(h + 9, &pkt.hdr.reth.rkey, 4);
    std::memcpy(h + 13, &pkt.hdr.reth.dma_length, 4);
  }
  return wire::crc32(wire::crc32(0, h), pkt.payload);
}

// A second copy of a PSN placed out of order differs from the first: one of them is forged
// (a genuine resend is identical), and which cannot be told. Neither is trusted: the PSN is
// forgotten as placed and made in-order only (ReceivedPsns::mark_contested), and reported
// missing so that the requester sends it again; what its in-order copy writes is final. A
// WRITE FIRST contested takes the placements made from its RETH with it.
void contest(QueuePair& qp, Transport& t, ReceivedPsns& o, uint32_t psn) {
  bump(t.counters().ooo_contested);
  log().debug("qp {:#x}: two different copies of psn {:#x} out of order: contested", qp.qpn(), psn);
  uint32_t last = psn;
  if (const WritePlacement* w = o.write_at(psn)) {
    for (uint32_t i = 1; i < w->npsn; ++i) {
      const uint32_t p = psn_add(psn, i);
      if (psn_diff(o.next, p) <= 0) break;
      if (o.placed(p)) {
        o.unplace(p);
        bump(t.counters().ooo_unplaced);
      }
      last = p;
    }
  }
  o.mark_contested(psn);
  send_selective_nak(qp, t, psn, last);
}

// A packet without Bth::resend (a first transmission, as far as its sender says) arrived at
// `psn`, at or behind ReceivedPsns::next. A requester sends new PSNs in order, so whatever
// made the responder see PSNs beyond `psn` first was not sent by it after this packet:
// forged (or reordered on the way). The PSNs from `psn` up to next are forgotten — placed
// data stays in memory and is written again by the genuine copies — and next comes back to
// `psn`, so that the genuine stream is placed and reported afresh. Costs at most the
// retransmission of PSNs that were genuine (reordered), never a PSN consumed in a forged
// copy's stead.
void forget_from(QueuePair& qp, Transport& t, ReceivedPsns& o, uint32_t psn) {
  const uint32_t n = o.clear_range(psn, o.next);
  if (n) {
    bump(t.counters().ooo_unplaced, n);
    log().debug("qp {:#x}: first transmission of psn {:#x} behind {:#x}: {} placed PSNs forgotten",
                qp.qpn(), psn, o.next, n);
  }
  o.next = psn;
}

// An out-of-order request from a requester that negotiated selective retransmission
// (ResponderState::peer_selective). Rules beyond the in-order checks (place_early), each so
// that a forged packet costs at most a retransmission (docs/architecture.md, "What an
// attacker on the network can and cannot do"):
//  - a copy of a placed PSN is a duplicate only when identical (fingerprint); otherwise the
//    PSN is contested (contest());
//  - a contested PSN is taken in order only;
//  - a first transmission behind ReceivedPsns::next makes the PSNs from it on forgotten
//    (forget_from());
//  - behind next, a resend is placed only right after a PSN placed already: resends fill a
//    reported gap from its start, so a packet inside a gap whose first PSN is missing can
//    only be a resend whose predecessor was lost again, or forged — it waits for its turn.
void on_out_of_order(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const uint32_t psn = pkt.hdr.bth.psn;
  const uint32_t ahead = uint32_t(psn_diff(psn, qp.resp.epsn));  // > 0 here
  if (!qp.resp.ooo) {
    qp.resp.ooo = std::make_unique<ReceivedPsns>(t.ooo_max_psns());
    qp.resp.ooo->next = qp.resp.epsn;
  }
  ReceivedPsns& o = *qp.resp.ooo;
  o.sync(qp.resp.epsn);
  if (psn_diff(o.next, qp.resp.epsn) < 0) o.next = qp.resp.epsn;
  // The ring grows to cover the packet (its PSNs, for a READ: next moves past them), up to
  // its largest span; beyond that the packet is dropped as a go-back-N responder would, and
  // reported with the gap before the next packet it can keep.
  const uint32_t span_left = o.max_span() - std::min(ahead, o.max_span());
  const uint32_t covers = std::min(request_psns(qp, pkt), std::max<uint32_t>(span_left, 1));
  if (psn_diff(o.next, qp.resp.epsn) == 0) o.shrink_when_idle(t.now_ns());
  if (!o.reach(qp.resp.epsn, ahead + covers - 1, t.now_ns())) {
    bump(t.counters().out_of_seq_request);
    bump(t.counters().ooo_beyond_span);
    return;
  }
  if (o.placed(psn)) {
    if (o.digest(psn) == fingerprint(pkt)) {
      bump(t.counters().duplicate_request);
      if (pkt.hdr.bth.ack_req) report_gap_again(qp, t, o);
      return;
    }
    return contest(qp, t, o, psn);
  }
  bump(t.counters().out_of_seq_request);
  if (o.contested(psn)) {
    bump(t.counters().ooo_refused);
    o.mark_reported(psn, false);  // reported again when the expected PSN reaches it
    return;
  }
  if (!pkt.hdr.bth.resend && psn_diff(o.next, psn) > 0) forget_from(qp, t, o, psn);
  if (qp.resp.in_write && !o.write_holding(qp.resp.write_first_psn))
    o.add_write({qp.resp.write_first_psn, qp.resp.write_base, qp.resp.write_length,
                 read_psns(qp, qp.resp.write_length), qp.resp.write_rkey, qp.resp.write_va});
  const bool in_gap = psn_diff(o.next, psn) > 0;
  const bool keepable = !in_gap || o.placed(psn_add(psn, wire::kPsnMask));
  const bool placed = keepable && place_early(qp, pkt, t, o);
  if (placed || (keepable && stage_early(qp, pkt, o))) {
    // A staged packet counts its message's end when it is executed, not stepped over.
    bump(placed ? t.counters().ooo_placed : t.counters().ooo_staged);
    o.mark_placed(psn, placed && (pkt.info->mask & (wire::kIsLast | wire::kIsOnly)),
                  fingerprint(pkt));
    if (psn_diff(psn, o.next) > 0) send_selective_nak(qp, t, o.next, psn_add(psn, wire::kPsnMask));
    if (psn_diff(psn, o.next) >= 0) o.next = psn_add(psn, 1);
    if (pkt.hdr.bth.ack_req && qp.resp.peer_sack) send_selective_ack(qp, t, o);
    return;
  }
  if (pkt.info->mask & (wire::kIsWrite | wire::kIsSend)) bump(t.counters().ooo_refused);
  // Not placeable now: as if lost. Reported with the gap before it when it is new; when it
  // is a resend, again once the expected PSN reaches it (advance_over_placed).
  if (psn_diff(psn, o.next) >= 0) {
    send_selective_nak(qp, t, o.next, psn);
    o.next = psn_add(psn, covers);
  } else {
    o.mark_reported(psn, false);
  }
}

// After the expected PSN moved: steps over the packets placed early (their MSN and WRITE
// state, in order) up to the first staged one (on_request executes it), ACKs if it stepped,
// and reports the gap now at the expected PSN if nobody has yet.
void advance_over_placed(QueuePair& qp, Transport& t) {
  ReceivedPsns& o = *qp.resp.ooo;
  o.sync(qp.resp.epsn);
  uint32_t& epsn = qp.resp.epsn;
  bool stepped = false, ended = false;
  uint32_t last = epsn;
  while (psn_diff(o.next, epsn) > 0 && o.placed(epsn) && !o.staged(epsn)) {
    ended = o.ends_message(epsn);
    if (ended) qp.resp.msn = psn_add(qp.resp.msn, 1);
    o.clear(epsn);
    last = epsn;
    epsn = psn_add(epsn, 1);
    stepped = true;
  }
  if (stepped) {
    o.sync(epsn);
    qp.resp.in_write = false;
    if (!ended) {
      if (const WritePlacement* w = o.write_holding(last)) {
        const uint64_t off = uint64_t(psn_diff(epsn, w->first_psn)) * qp.mtu;
        qp.resp.in_write = true;
        qp.resp.write_base = w->base;
        qp.resp.write_first_psn = w->first_psn;
        qp.resp.write_length = w->length;
        qp.resp.write_rkey = w->rkey;
        qp.resp.write_va = w->va;
        qp.resp.write_ptr = w->base ? w->base + off : nullptr;  // null: placed, region gone
        qp.resp.write_left = w->length - off;
      } else {
        log().error("qp {:#x}: placed psn {:#x} belongs to no WRITE", qp.qpn(), last);
      }
    }
    ack_later(qp, last);
  }
  o.drop_writes_before(epsn);
  if (psn_diff(o.next, epsn) <= 0) {
    o.next = epsn;  // nothing beyond: idle, the ring back to its first span in time
    o.shrink_when_idle(t.now_ns());
    return;
  }
  if (!o.reported(epsn)) {
    const uint32_t end = o.first_marked(epsn, o.next);
    if (end != epsn) send_selective_nak(qp, t, epsn, psn_add(end, wire::kPsnMask));
  }
}

// An XRC request names the SRQ that receives it (XRCETH); the XRC target takes WQEs, the
// CQ and the PD for memory checks from it (annex A14.4). It must be an XRC SRQ of the
// target QP's XRC domain. Otherwise a new request is refused as invalid (NAK, ERR, as any
// class C error); a duplicate or out-of-sequence one is only dropped and counted (its PSN
// is not the expected one: it may be forged and must not move the QP to ERR). False when
// the packet goes no further.
bool resolve_xrc_srq(QueuePair& qp, const wire::Packet& pkt, Transport& t, RequestCheck c) {
  SharedReceiveQueue* srq = t.find_srq(pkt.hdr.xrceth.srqn);
  if (srq && srq->kind() == SharedReceiveQueue::Kind::kXrc && srq->xrcd() == qp.xrcd) {
    qp.resp.xrc_srq = srq;
    return true;
  }
  qp.resp.xrc_srq = nullptr;
  bump(t.counters().rcvd_bad_xrc_srq);
  log().debug("qp {:#x}: {} psn {:#x} names SRQ {:#x}, not an XRC SRQ of the QP's domain", qp.qpn(),
              pkt.info->name, pkt.hdr.bth.psn, pkt.hdr.xrceth.srqn);
  if (c == RequestCheck::kNew) nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, pkt.hdr.bth.psn);
  return false;
}

}  // namespace

const char* to_string(RequestCheck c) {
  static constexpr const char* kNames[] = {"new",
                                           "duplicate",
                                           "out of sequence",
                                           "missing first packet",
                                           "missing last packet",
                                           "bad payload length"};
  static_assert(std::size(kNames) == size_t(RequestCheck::kBadLength) + 1);
  return kNames[static_cast<size_t>(c)];
}

RequestCheck check_request(const QueuePair& qp, const wire::Packet& pkt) {
  RequestCheck c = check_psn(qp, pkt);
  if (c == RequestCheck::kNew) c = check_op_sequence(qp, pkt);
  if (c == RequestCheck::kNew) c = check_length(qp, pkt);
  return c;
}

namespace {
// A request at the expected PSN (check: check_request's verdict, kNew unless refused):
// executes it, and steps over what was placed beyond it. `staged`: it was kept beyond a gap
// (ReceivedPsns::stage) and is executed now, in order.
void accept(QueuePair& qp, const wire::Packet& pkt, Transport& t, RequestCheck c, bool staged) {
  const uint32_t psn = pkt.hdr.bth.psn;
  qp.resp.nak_sent = false;  // the expected PSN has arrived
  if (qp.resp.ooo && !staged && !pkt.hdr.bth.resend && psn_diff(qp.resp.ooo->next, psn) > 0) {
    qp.resp.ooo->sync(qp.resp.epsn);
    forget_from(qp, t, *qp.resp.ooo, psn);  // a first transmission of the expected PSN
  }
  if (c != RequestCheck::kNew) {
    log().debug("qp {:#x}: {} psn {:#x} refused: {}", qp.qpn(), pkt.info->name, psn, to_string(c));
    return nak_and_fail(qp, t, wire::NakCode::kInvalidRequest, psn);
  }
  const uint32_t m = pkt.info->mask;
  if (m & wire::kIsSend)
    on_send(qp, pkt, t);
  else if (m & wire::kIsWrite)
    on_write(qp, pkt, t);
  else if (m & wire::kIsRead)
    on_read(qp, pkt, t);
  else if (m & wire::kIsAtomic)
    on_atomic(qp, pkt, t);
  else if (m & wire::kIsAtomicWrite)
    on_atomic_write(qp, pkt, t);
  if (qp.attr.state == QpState::kErr) return;
  // Selective retransmission is the requester's to ask for, and it is believed from
  // requests accepted in order only: their PSN is the expected one (IBTA's own bar).
  if (!staged && pkt.hdr.bth.selective && psn_diff(qp.resp.epsn, psn) > 0) {
    qp.resp.peer_selective = true;
    qp.resp.peer_sack = pkt.hdr.bth.sack;
    qp.resp.peer_sack_ranges = pkt.hdr.bth.sack && pkt.hdr.bth.sack_ranges;
  }
  if (qp.resp.ooo) {
    for (uint32_t p = psn; p != qp.resp.epsn; p = psn_add(p, 1)) qp.resp.ooo->clear(p);
    advance_over_placed(qp, t);
  }
}
}  // namespace

void on_request(QueuePair& qp, const wire::Packet& pkt, Transport& t) {
  const RequestCheck c = check_request(qp, pkt);
  if ((pkt.info->mask & wire::kHasXrceth) && !resolve_xrc_srq(qp, pkt, t, c)) return;
  if (c == RequestCheck::kOutOfSequence) {
    // The QP's negotiated mode, not the packet's bit: any packet can set that.
    if (qp.resp.peer_selective && t.selective_retransmit()) return on_out_of_order(qp, pkt, t);
    return on_out_of_sequence(qp, pkt.hdr.bth.psn, t);
  }
  if (c == RequestCheck::kDuplicate) return on_duplicate(qp, pkt, t);
  accept(qp, pkt, t, c, /*staged=*/false);
  // Requests staged beyond the gap this one closed, each now at the expected PSN: executed
  // in PSN order, as if they arrived now (one at a time: no recursion over a long run).
  // One that does not move the expected PSN (RNR, an error) ends the run: its PSN is
  // missing again, and the requester resends from it.
  while (qp.resp.ooo && qp.attr.state != QpState::kErr) {
    const uint32_t epsn = qp.resp.epsn;
    std::optional<StagedRequest> r = qp.resp.ooo->take_staged(epsn);
    if (!r) break;
    qp.resp.ooo->unplace(epsn);
    const wire::Packet p = r->packet();
    const RequestCheck pc = check_request(qp, p);
    if ((p.info->mask & wire::kHasXrceth) && !resolve_xrc_srq(qp, p, t, pc)) break;
    accept(qp, p, t, pc, /*staged=*/true);
    if (qp.resp.epsn == epsn) break;
  }
}

void on_congestion_experienced(QueuePair& qp, Transport& t) {
  const uint64_t now = t.now_ns();
  if (qp.resp.last_cnp_ns && now - qp.resp.last_cnp_ns < kMinTimeBetweenCnpsNs) return;
  qp.resp.last_cnp_ns = now;
  t.transmit(wire::cnp_headers(qp.attr.dest_qp_num), qp.remote_ip, {}, 0);
  bump(t.counters().cnp_sent);
}

void resume(QueuePair& qp, Transport& t) {
  auto& pending = qp.resp.pending;
  if (qp.attr.state == QpState::kErr || qp.attr.state == QpState::kReset) {
    pending.clear();
    return;
  }
  uint64_t burst = 0;  // bytes queued since the last look at the path
  bool looked = false;
  wire::Headers h;  // READ responses' headers, rewritten per packet
  while (!pending.empty()) {
    if (burst >= kResponseBurstBytes) {
      t.send_queued();
      burst = 0;
      looked = false;
    }
    if (!looked) {
      if (t.path_busy(qp.remote_ip)) return t.wait_for_path(qp);
      looked = true;
    }
    PendingResponse& r = pending.front();
    if (!r.read) {
      t.transmit(r.control, qp.remote_ip, {}, 0);
      pending.pop_front();
      burst += wire::kBthBytes;
      continue;
    }
    // Checked again: the MR may have been deregistered (or the MW invalidated) meanwhile.
    const uint8_t* src = nullptr;
    if (r.length) {
      src = placement::check_remote(qp, t, r.rkey, r.va, r.length, kRemoteRead);
      if (!src)
        return nak_and_fail(qp, t, wire::NakCode::kRemoteAccessError, psn_add(r.psn, r.sent));
    }
    while (r.sent < r.packets && burst < kResponseBurstBytes) {
      send_read_response(qp, t, r, src, r.sent++, h);
      burst += qp.mtu;
    }
    if (r.sent == r.packets) pending.pop_front();
  }
}

void flush_ack(QueuePair& qp, Transport& t) {
  if (!qp.resp.ack_pending) return;
  qp.resp.ack_pending = false;
  send_ack(qp, t, wire::aeth_ack(), qp.resp.ack_psn);
}

}  // namespace softrdma::engine::responder
